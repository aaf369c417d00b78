"""Files replaced whole: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``; the folder (made with its
    parents when missing) is looked up once, its descriptor serving both. On a shared file system every path walk
    costs a lookup per name, and a job's files are written by every node: making the folder, writing and renaming
    by full paths took four walks (tools/bench/scale_sim/folder.py)."""
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    tmp = f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=folder), "w",
                  encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
