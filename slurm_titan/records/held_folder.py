"""A folder of the job folder opened once and held: its files are reached through the folder's descriptor.

On a shared file system every path walk costs a lookup per name, none cached on many (NFS with ``noac``, a busy
Lustre): a node that writes its report three times, lists its peers' reports and checks the batch shell's heartbeat
by full paths made ~78 metadata operations in a hang's round, 16,300/s fitted at 512 nodes
(tools/bench/scale_sim/folder.py). Through a held descriptor each is a lookup of one name.

A listing opens the folder again by its name in its (held) parent: an NFS client revalidates a folder it opens by
name (close-to-open), where a listing through a descriptor held open may be served from its cache until the
folder's attributes time out (``acdirmax``, 60 s by default): a peer's report, a verdict or a collected file would
be seen late.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

FOLDER = os.O_RDONLY | os.O_DIRECTORY
READERS = 16
"""Files of the job folder read at once where a node or the batch shell reads many (every node's report, holding or
crashed rank's log): on a shared file system each read waits on the server's lookups, not on this host."""
T = TypeVar("T")
R = TypeVar("R")


def read_each(read: Callable[[T], R], items: list[T]) -> list[R]:
    """``read`` of every item, in order, ``READERS`` at once; the first exception raised is raised."""
    if len(items) <= 1:
        return [read(item) for item in items]
    with ThreadPoolExecutor(min(READERS, len(items))) as pool:
        return list(pool.map(read, items))


def _open_made(path: Path) -> int:
    """A descriptor of the folder ``path``, made with its parents when missing."""
    try:
        return os.open(path, FOLDER)
    except FileNotFoundError:
        path.mkdir(parents=True, exist_ok=True)
        return os.open(path, FOLDER)


def _open_in(parent: int, name: str) -> int:
    """A descriptor of the folder ``name`` in ``parent``, made when missing."""
    try:
        return os.open(name, FOLDER, dir_fd=parent)
    except FileNotFoundError:
        try:
            os.mkdir(name, dir_fd=parent)
        except FileExistsError:  # made by another node meanwhile
            pass
        return os.open(name, FOLDER, dir_fd=parent)


class HeldFolder:
    """``path``, made with its parents when missing, opened until :meth:`close` (or the ``with`` block's end), with
    ``parent``, a descriptor of its parent folder (for the listings), which it takes over. Not given, it is opened by
    path here, so that the walk of the whole path is made once, as the folder is taken, and never in a round that
    every node starts at once (a hang's, whose first listing walked it); with ``lists=False`` (a folder only written
    through) not until a first listing: one descriptor fewer to open and close."""

    def __init__(self, path: Path, parent: int | None = None, *, lists: bool = True) -> None:
        self.path = path = path.absolute()
        self.parent = _open_made(path.parent) if parent is None and lists else parent
        if self.parent is None:
            self.fd = _open_made(path)
            return
        try:
            self.fd = _open_in(self.parent, path.name)
        except OSError:
            os.close(self.parent)
            raise

    def sub(self, name: str) -> HeldFolder:
        """The folder ``name`` in this one, made when missing, held open apart (closed on its own): a lookup of
        one name, where a path would walk them all again."""
        return HeldFolder(self.path / name, os.dup(self.fd))

    def replace_text(self, name: str, text: str) -> None:
        """Write ``text`` to a temporary file in the folder and rename it over ``name``: a reader sees the old file
        or the new one, never a part of either."""
        tmp = f".{name}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self.fd), "w",
                  encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def write_text(self, name: str, text: str) -> None:
        """``name`` made (or emptied) and ``text`` written to it, in place: for a file written once and read by people
        only (a reader may see a part of it), three operations fewer than :meth:`replace_text` on a shared file system
        (no temporary name to look up and rename)."""
        with open(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self.fd), "w",
                  encoding="utf-8") as out:
            out.write(text)

    def create_exclusive(self, name: str) -> int | None:
        """A descriptor of ``name`` made by this call for writing, None when it exists (made by another)."""
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=self.fd)
        except FileExistsError:
            return None

    def create(self, name: str) -> None:
        """``name`` made empty when missing (left as it is when not)."""
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=self.fd))

    def touch(self, name: str) -> None:
        """``name``'s modification time set to now, the file made when missing."""
        try:
            os.utime(name, dir_fd=self.fd)
        except FileNotFoundError:
            self.create(name)

    def read_text(self, name: str) -> str:
        with open(os.open(name, os.O_RDONLY, dir_fd=self.fd), encoding="utf-8") as text:
            return text.read()

    def stat(self, name: str) -> os.stat_result | None:
        """``name``'s status, None when it does not exist."""
        try:
            return os.stat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """The folder's entries now: the folder opened again by its name in its parent, listed, closed."""
        if self.parent is None:
            self.parent = os.open(self.path.parent, FOLDER)
        fresh = os.open(self.path.name, FOLDER, dir_fd=self.parent)
        try:
            return os.listdir(fresh)
        finally:
            os.close(fresh)

    def close(self) -> None:
        for fd in (self.fd, self.parent):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd, self.parent = -1, None

    def __enter__(self) -> HeldFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
