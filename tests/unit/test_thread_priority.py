"""Background threads' own CPUs and priority (slurm_titan.thread_priority)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest

from slurm_titan.cpulist import format_cpu_list, parse_cpu_list
from slurm_titan.thread_priority import background_thread, confine_thread


@pytest.mark.parametrize(("text", "cpus"), [("1", {1}), ("0-3,8", {0, 1, 2, 3, 8}),
                                            ("48-50, 112-113", {48, 49, 50, 112, 113}), ("2,2", {2})])
def test_cpu_lists_parse_and_format_back(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(frozenset(cpus))) == cpus


@pytest.mark.parametrize(("text", "problem"), [("", "is not a CPU list"), ("a-b", "is not a CPU list"),
                                               ("1-", "is not a CPU list"), ("-1", "is not a CPU list"),
                                               ("3-1", "the range runs backwards")])
def test_bad_cpu_lists_are_refused_in_one_line(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_cpu_list(text)


def _in_thread(fn) -> dict[str, object]:
    """Run `fn` in a new thread, then report that thread's CPUs and those of a thread it started."""
    seen: dict[str, object] = {}

    def body() -> None:
        fn()
        seen["own"] = os.sched_getaffinity(threading.get_native_id())
        child = threading.Thread(target=lambda: seen.update(child=os.sched_getaffinity(threading.get_native_id())))
        child.start()
        child.join()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen


def test_a_confined_thread_and_the_threads_it_starts_run_on_its_cpus_only() -> None:
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    training_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = _in_thread(lambda: background_thread(5, frozenset({cpu})))
    assert seen["own"] == seen["child"] == {cpu}
    assert seen["nice"] == min(19, training_nice + 5)
    assert os.sched_getaffinity(0) == before  # the caller (training) keeps its CPUs


def test_cpus_the_job_may_not_use_leave_the_thread_where_it_was_with_a_warning(caplog) -> None:
    allowed = os.sched_getaffinity(0)
    with caplog.at_level(logging.WARNING, logger="slurm_titan.thread_priority"):
        seen = _in_thread(lambda: confine_thread(frozenset({4000})))
    assert seen["own"] == allowed
    assert "checkpoint.upload_cpus 4000 cannot be used here" in caplog.text


SESSION_CHILD = """
import subprocess, sys
from slurm_titan.thread_priority import lower_session_priority
assert lower_session_priority(19)
print(open("/proc/self/autogroup").read().strip(), flush=True)
rank = ("from slurm_titan.thread_priority import take_own_session\\n"
        "before = open('/proc/self/autogroup').read().strip()\\n"
        "take_own_session()\\n"
        "print(before, open('/proc/self/autogroup').read().strip(), sep='|')")
print(subprocess.run([sys.executable, "-c", rank], capture_output=True, text=True, check=True).stdout.strip())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no scheduling autogroups in this kernel")
def test_a_standby_session_yields_as_a_whole_and_its_adopted_ranks_leave_it_for_their_own() -> None:
    # A standby step's supervisor (a session of its own, as slurmstepd starts it: here start_new_session) lowers its
    # session's scheduling group; its rank, started inside it, shares the group until it takes a session of its own
    done = subprocess.run([sys.executable, "-c", SESSION_CHILD], capture_output=True, text=True, check=True,
                          start_new_session=True)
    supervisor, rank = done.stdout.splitlines()
    before, after = rank.split("|")
    assert supervisor.endswith("nice 19") and before == supervisor
    assert after.endswith("nice 0") and after.split()[0] != supervisor.split()[0]
