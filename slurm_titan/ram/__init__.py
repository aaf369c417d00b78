"""The RAM tier: every few steps each rank's whole training state in host memory of its node and of a partner node.

Torch-free (the ranks' side, which saves and loads the snapshots' files, is :mod:`slurm_titan.rank.ram_snapshot`;
the node supervisor's, which replicates and recovers, is :mod:`slurm_titan.node.supervisor.ram`). Top to bottom:

- :mod:`.layout`    where a job's snapshots live in a node's memory (a tmpfs folder, ``/dev/shm`` by default)
- :mod:`.snapshot`  one rank's snapshot of one step: its files and the manifest written last; what a node holds
- :mod:`.choice`    the newest step every rank can get, and from which node
- :mod:`.transfer`  a node's snapshot server (HTTP on the node's own port) and its clients: push to the partner,
                    pull on recovery, each file's size and XXH3-64 digest checked

The memory a node needs is the preflight's (:mod:`slurm_titan.doctor.checks`, from the plan's checkpoint size).
"""
