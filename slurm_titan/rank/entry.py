"""One training process: prepare the device kind, then run torchtitan's own trainer entry point.

Started by the node supervisor with RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
set; every argument after the program name is torchtitan's.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from slurm_titan import envvars
from slurm_titan.rank import preemption, stacks, start_gate
from slurm_titan.records import rank_progress
from slurm_titan.thread_priority import BACKGROUND_NICE, lower_thread_priority, take_own_session


def prepare_device(device: str) -> None:
    """Must run before torchtitan is imported: torchtitan picks its device at import."""
    if device == "cpu":
        from slurm_titan.rank import cpu_device

        cpu_device.install()
    elif device == "npu":
        import torch_npu  # noqa: F401  registers the "npu" device and the "hccl" backend

        from slurm_titan.rank import npu_peak_flops

        npu_peak_flops.install()  # MFU against the Ascend chip's peak, not an A100's


def import_trainer(device: str) -> Callable[[], None]:
    """torchtitan's entry point, imported after the device kind is prepared, with the cyclic garbage collector off:
    the import makes ~550,000 objects that live as long as the process (and ~12,700 of garbage, kept), and
    collecting as it goes cost 21 % more CPU (7.31 against 6.05 CPU-seconds, means of 6 alternated runs on a 2-core
    machine). What it made is then frozen out of every later collection (`gc.freeze`: the training loop's
    collections do not walk it)."""
    gc.disable()
    try:
        prepare_device(device)
        from torchtitan.train import main as torchtitan_main
    finally:
        gc.enable()
    gc.freeze()
    return torchtitan_main


def import_in_background(device: str) -> Future[Callable[[], None]]:
    """:func:`import_trainer` in a thread of its own at BACKGROUND_NICE, for a standby step's rank: it imports while
    the attempt before it trains, mostly on the CPU that training leaves idle (the supervisor lowers the step's
    scheduling group too: thread_priority). The main thread, which trains once the word comes, and every thread it
    starts keep their priority (nice is per thread on Linux); the few threads that libraries start during the import
    (pyarrow's allocator's, idle) inherit the lower one. The future holds the entry point, or the import's error."""
    imported: Future[Callable[[], None]] = Future()

    def run() -> None:
        lower_thread_priority(BACKGROUND_NICE)
        begin, cpu = time.monotonic(), time.thread_time()
        try:
            imported.set_result(import_trainer(device))
        except BaseException as error:  # noqa: BLE001 - raised again in the main thread
            imported.set_exception(error)
            return
        print(f"slurm-titan: a standby step's rank: torch and torchtitan imported at nice {BACKGROUND_NICE} in "
              f"{time.monotonic() - begin:.1f} s ({time.thread_time() - cpu:.1f} CPU-seconds)", file=sys.stderr,
              flush=True)

    threading.Thread(target=run, name="import-in-background", daemon=True).start()  # daemon: a signal may end us
    return imported


def main() -> None:
    preemption.install_handlers()  # first: Slurm's warning may come while torch is still importing
    stacks.register_in_rank()  # the watchdog's fallback for stacks, before anything can hang
    rank_progress.enter(rank_progress.Phase.STARTUP)
    device = os.environ.get(envvars.DEVICE, "npu")
    if not os.environ.get(envvars.STANDBY):
        torchtitan_main = import_trainer(device)
        start_gate.wait_for_start()  # the import overlapped the node's preflight and the batch shell's decision
    else:  # the word may come before the import is done: it goes on at training's priority from there
        importing = import_in_background(device)
        word = start_gate.wait_for_word()
        if take_own_session():  # out of the supervisor's session, whose scheduling group stays lowered
            print("slurm-titan: a standby step's rank, adopted: it trains in a session of its own, out of its "
                  "supervisor's scheduling group (lowered while it stood by)", file=sys.stderr, flush=True)
        torchtitan_main = importing.result()
        os.environ.update(word)  # once the import is done: no thread of it reads the environment meanwhile
    sys.argv = ["torchtitan", *sys.argv[1:]]
    torchtitan_main()


if __name__ == "__main__":
    main()
