"""What runs on the compute nodes: the per-node supervisor, the per-rank entry and device set-up."""
