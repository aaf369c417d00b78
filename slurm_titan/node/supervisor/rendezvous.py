"""Where and how the ranks of a job meet, derived from Slurm's own variables only.

Launch model: Slurm starts ONE task per node (``srun --ntasks-per-node=1``); that task, the
node supervisor, starts one training process per device. One task per node rather than one
per device because the node is the unit that owns node-local work: checkpoint shards on
local disk, their upload, the preflight doctor and the signal handling that must outlive a
rank. The supervisor gives every process RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT itself, so nothing depends on torchrun's elastic agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_titan.doctor.facts import EPHEMERAL_RANGE_FILE
from slurm_titan.envvars import NODES
from slurm_titan.hostlist import expand_hostlist

DEFAULT_PORT_WINDOW = (20000, 29999)


class RendezvousError(RuntimeError):
    """Slurm's environment does not describe a usable multi-node job."""


@dataclass(frozen=True)
class Rendezvous:
    """The rendezvous of one node of a job."""

    master_addr: str
    master_port: int
    node_rank: int
    num_nodes: int
    procs_per_node: int
    hosts: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.procs_per_node

    def process_env(self, local_rank: int) -> dict[str, str]:
        """The torch.distributed environment of one process on this node."""
        if not 0 <= local_rank < self.procs_per_node:
            raise ValueError(f"local rank {local_rank} outside 0..{self.procs_per_node - 1}")
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.world_size),
            "RANK": str(self.node_rank * self.procs_per_node + local_rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.procs_per_node),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
        }


def master_port(job_id: int, window: tuple[int, int] = DEFAULT_PORT_WINDOW) -> int:
    """A port that depends on the job id only, so it is the same on every node and after a requeue."""
    low, high = window
    return low + job_id % (high - low + 1)


def check_port_outside(port: int, ephemeral: tuple[int, int]) -> None:
    """Refuse a port inside the kernel's ephemeral range: any outgoing connection may hold it (EADDRINUSE)."""
    if ephemeral[0] <= port <= ephemeral[1]:
        raise RendezvousError(
            f"master port {port} lies in this node's ephemeral port range {ephemeral[0]}-{ephemeral[1]} "
            f"({EPHEMERAL_RANGE_FILE}); set slurm.port_window to a range outside it"
        )


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise RendezvousError(f"{name} is not set: not running inside a Slurm job step")
    try:
        return int(value)
    except ValueError:
        raise RendezvousError(f"{name}={value!r} is not an integer") from None


def from_slurm_env(
    env: Mapping[str, str],
    procs_per_node: int,
    port_window: tuple[int, int] = DEFAULT_PORT_WINDOW,
    ephemeral: tuple[int, int] | None = None,
) -> Rendezvous:
    """Build this node's rendezvous from Slurm's variables and the attempt's node list.

    With envvars.NODES (the batch shell's choice of nodes for this attempt, spares left out) the
    node rank is this node's position in it (SLURMD_NODENAME); without it, SLURM_JOB_NODELIST /
    SLURM_NODEID / SLURM_JOB_NUM_NODES as Slurm gives them. The port comes from SLURM_JOB_ID. The node count is
    the attempt's own (envvars.NODES), not the planned `slurm.nodes` of the batch spec (node.batch_spec): a run that
    shrank goes on with fewer.
    """
    if env.get(NODES):
        hosts = tuple(env[NODES].split(","))
        name = env.get("SLURMD_NODENAME")
        if name not in hosts:
            raise RendezvousError(f"SLURMD_NODENAME={name} is not one of {NODES}={env[NODES]}")
        node_rank, num_nodes = hosts.index(name), len(hosts)
    else:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise RendezvousError("SLURM_JOB_NODELIST is not set: not running inside a Slurm job")
        try:
            hosts = tuple(expand_hostlist(nodelist))
        except ValueError as error:
            raise RendezvousError(str(error)) from None
        num_nodes = _int_var(env, "SLURM_JOB_NUM_NODES")
        node_rank = _int_var(env, "SLURM_NODEID")
        if num_nodes != len(hosts):
            raise RendezvousError(f"SLURM_JOB_NUM_NODES={num_nodes} but SLURM_JOB_NODELIST={nodelist} "
                                  f"names {len(hosts)}")
        if not 0 <= node_rank < num_nodes:
            raise RendezvousError(f"SLURM_NODEID={node_rank} outside 0..{num_nodes - 1}")
    port = master_port(_int_var(env, "SLURM_JOB_ID"), port_window)
    if ephemeral is not None:
        check_port_outside(port, ephemeral)
    return Rendezvous(hosts[0], port, node_rank, num_nodes, procs_per_node, hosts)
