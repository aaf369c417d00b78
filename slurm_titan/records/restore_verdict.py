"""What a node's checkpoint restore tells its ranks: one JSON message over each rank's gate pipe.

node.restore decides it and node.supervisor's RankGroup.release sends it; rank.restore_gate receives it and
returns it to rank.checkpointer. An empty message means the restore failed or was cut short.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RestoreVerdict:
    """The restore's outcome as the ranks need it."""

    world_size_changed: bool = False  # saved by another world size: DCP reshards model and optimizer

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RestoreVerdict:
        return cls(**json.loads(data))
