"""The node supervisor's modules (one Slurm task per node, started by submitit; torch-free): the rendezvous, the
preflight, the node's checkpoint restore, the ranks it starts by module name, their watchdog and stack dumps, and
the requeue from a surviving node when the batch host is lost. Never imports the batch shell's modules."""
