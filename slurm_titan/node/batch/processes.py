"""The batch shell's processes as /proc shows them: whether one still runs, its command name, its parent (the srun
steps it started, the shell the lease keeper outlives)."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as ended)."""
    fields = _stat(pid)
    return fields is not None and bool(fields) and fields[0] not in ("Z", "X")


def command(pid: int) -> str | None:
    """The command name of `pid` (its `comm`), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def parent(pid: int) -> int | None:
    """The parent of `pid`, None when there is no such process."""
    fields = _stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 and fields[1].isdigit() else None
