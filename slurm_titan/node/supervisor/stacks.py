"""The Python stacks of a node's ranks, taken by the supervisor on a hang, into one file of the node's,
`<job>/attempts/<A>/stacks/node-<N>.txt`.

py-spy first (`py-spy dump --nonblocking --pid P`: it reads the rank's memory without stopping it, so it
works on a rank that is itself stopped; the project installs py-spy with its `train`/`npu` extras). When
py-spy is missing or refused (ptrace rules: kernel.yama.ptrace_scope, a container without CAP_SYS_PTRACE),
faulthandler: every rank registered `faulthandler.register(DUMP_SIGNAL, all_threads=True)` at start-up
(rank.stacks.register_in_rank) into its own node-local file; the supervisor sends DUMP_SIGNAL (and SIGCONT to a
stopped rank, which cannot run a handler otherwise) and copies the file. The node log says once which way
was used, and why.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_titan.records import run_folder
from slurm_titan.records.held_folder import HeldFolder
from slurm_titan.signals import DUMP_SIGNAL

PY_SPY_TIMEOUT_S = 20.0
FAULTHANDLER_WAIT_S = 5.0
COLLECTIVE_FRAMES = ("distributed_c10d.py", "_functional_collectives.py", "_fsdp_collectives.py")
"""Files whose frames show a rank waiting in a collective: a peer of the stuck rank, not the stuck one."""


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T, t, Z, ...); '?' when it is gone."""
    return process_sample(pid)[0]


def process_sample(pid: int) -> tuple[str, int]:
    """The kernel's state of `pid` and the CPU time its threads have used (user + system, in clock ticks):
    ('?', 0) when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?", 0
    fields = stat.rpartition(")")[2].split()  # from field 3, the state; utime and stime are fields 14 and 15
    return fields[0], int(fields[11]) + int(fields[12])


def frozen(state: str) -> bool:
    """A process that does not run at all: stopped (T, t) or in uninterruptible sleep (D, a stuck device
    or mount). A rank waiting in a collective sleeps interruptibly (S)."""
    return state in ("T", "t", "D")


def stopped(state: str) -> bool:
    """A process stopped by a signal (T: SIGSTOP, SIGTSTP): it runs again only when told. A tracer's stop (t: gdb, a
    blocking py-spy) is someone looking on purpose, and keeps the phase's budget."""
    return state == "T"


def in_collective(stack: str) -> bool:
    return any(name in stack for name in COLLECTIVE_FRAMES)


def py_spy() -> str | None:
    """The py-spy beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def write_stacks(attempt_dir: HeldFolder, node: int, stacks: dict[int, str]) -> None:
    """The ranks' stacks (rank -> text) in node `node`'s file of the attempt's stacks folder, each under a
    `==> rank R <==` line, in rank order (:func:`run_folder.node_stacks_name`)."""
    with attempt_dir.sub(run_folder.STACKS) as folder:
        folder.write_text(run_folder.node_stacks_name(node), "".join(
            f"==> rank {rank} <==\n{text.rstrip()}\n" for rank, text in sorted(stacks.items())))


def _ptrace_note() -> str:
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return ""
    return f" (kernel.yama.ptrace_scope={scope})" if scope != "0" else ""


@dataclass
class StackDumper:
    """Dumps ranks' stacks; `method` says how the last dump was taken and `why`, for the node log."""

    local_files: dict[int, Path]  # rank -> the file its faulthandler writes
    method: str = ""
    why: str = ""

    def dump(self, ranks: dict[int, int], attempt_dir: HeldFolder, node: int) -> dict[int, str]:
        """Write every rank's stacks (rank -> pid) into the node's one file in the attempt's stacks folder,
        `node-<N>.txt` (through `attempt_dir`, held open: a file a rank, each by its path, walked the whole path again,
        ~12 lookups a rank on a shared file system, as every node of a hang writes at once); returns each rank's
        text. A file that cannot be written is said in `why`: the stacks still name the culprit."""
        stacks: dict[int, str] = {}
        spy = py_spy()
        if spy is None:
            self.method, self.why = "faulthandler", "py-spy missing"
        else:
            running = {rank: subprocess.Popen([spy, "dump", "--nonblocking", "--pid", str(pid)], text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                       for rank, pid in ranks.items()}
            for rank, child in running.items():
                try:
                    out, _ = child.communicate(timeout=PY_SPY_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    out = (child.communicate()[0] or "") + f"\npy-spy gave no answer in {PY_SPY_TIMEOUT_S:g} s"
                if child.returncode == 0:
                    stacks[rank] = out
                else:
                    self.why = f"py-spy failed: {(out.strip().splitlines() or ['?'])[-1]}{_ptrace_note()}"
            self.method = "py-spy" if stacks else "faulthandler"
        missing = {rank: pid for rank, pid in ranks.items() if rank not in stacks}
        stacks |= self._faulthandler(missing)
        if missing and stacks.keys() - missing.keys() and spy:
            self.method = "py-spy, faulthandler for some ranks"
        try:
            write_stacks(attempt_dir, node, stacks)
        except OSError as error:
            self.why = f"{self.why}; " * bool(self.why) + f"not written: {error}"
        return stacks

    def _faulthandler(self, ranks: dict[int, int]) -> dict[int, str]:
        """Signal each rank, wake it if stopped, and read what its handler wrote (waits up to a few s)."""
        for pid in ranks.values():
            state = process_state(pid)
            try:
                os.kill(pid, DUMP_SIGNAL)
                if state in ("T", "t"):
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue
        stacks: dict[int, str] = {}
        sizes: dict[int, int] = {}
        deadline = time.monotonic() + FAULTHANDLER_WAIT_S
        while len(stacks) < len(ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
            for rank in ranks.keys() - stacks.keys():
                path = self.local_files.get(rank)
                size = path.stat().st_size if path and path.exists() else 0
                if path is not None and size and sizes.get(rank) == size:  # written, and done writing
                    stacks[rank] = path.read_text(errors="replace")
                sizes[rank] = size
        for rank in ranks.keys() - stacks.keys():
            stacks[rank] = f"no stack: rank {rank} did not answer {DUMP_SIGNAL.name} in {FAULTHANDLER_WAIT_S:g} s " \
                           f"(state {process_state(ranks[rank])})\n"
        return stacks
