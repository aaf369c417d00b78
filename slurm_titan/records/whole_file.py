"""Files replaced whole: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

from pathlib import Path

from slurm_titan.records.held_folder import HeldFolder


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``; the folder (made with its
    parents when missing) is looked up once, its descriptor serving both (:class:`HeldFolder`)."""
    with HeldFolder(path.parent, lists=False) as folder:
        folder.replace_text(path.name, text)
