"""How many checkpoints each tier keeps: the `checkpoint.keep_*` settings as one value, from the YAML to the uploader.

Every bundle on the way (node.spec.CheckpointPlan, envvars.RankCheckpointEnv, ckpt.UploadSettings) holds one
:class:`Retention` and CheckpointSync takes it; ckpt.retention holds the rules that apply it. It lives down
here, not in ckpt, because the login node and the node supervisor hold it without importing the storage code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Retention:
    """`keep_local`: the newest step folders kept on node-local disk (0: all); `keep_remote`: the newest complete
    checkpoints kept at the remote location (0: all), and every one whose step is a multiple of `keep_every`
    (0: none)."""

    keep_local: int = 0
    keep_remote: int = 0
    keep_every: int = 0


KEEP_ALL = Retention()
"""Nothing is ever deleted, on either tier."""
