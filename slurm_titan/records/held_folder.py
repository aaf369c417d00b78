"""A folder of the job folder opened once and held: its files are reached through the folder's descriptor.

On a shared file system every path walk costs a lookup per name, none cached on many (NFS with ``noac``, a busy
Lustre): a node that writes its report three times, lists its peers' reports and checks the batch shell's heartbeat
by full paths made ~78 metadata operations in a hang's round, 16,300/s fitted at 512 nodes
(tools/bench/scale_sim/folder.py). Through a held descriptor each is a lookup of one name.
"""

from __future__ import annotations

import os
from pathlib import Path


class HeldFolder:
    """``path``, made with its parents when missing, opened until :meth:`close` (or the ``with`` block's end);
    ``fd``: a descriptor of ``path`` opened already, which it takes over."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = path
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                path.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self.fd = fd

    def sub(self, name: str) -> HeldFolder:
        """The folder ``name`` in this one, made when missing, held open apart (closed on its own): a lookup of
        one name, where a path would walk them all again."""
        try:
            return HeldFolder(self.path / name, os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.fd))
        except FileNotFoundError:
            try:
                os.mkdir(name, dir_fd=self.fd)
            except FileExistsError:  # made by another node meanwhile
                pass
            return HeldFolder(self.path / name, os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.fd))

    def replace_text(self, name: str, text: str) -> None:
        """Write ``text`` to a temporary file in the folder and rename it over ``name``: a reader sees the old file
        or the new one, never a part of either."""
        tmp = f".{name}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self.fd), "w",
                  encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

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
        """The folder's entries now (one listing through the descriptor)."""
        return os.listdir(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HeldFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
