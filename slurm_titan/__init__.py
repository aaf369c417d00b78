"""slurm-titan: run torchtitan pretraining on Slurm clusters, with safe checkpoints and preemption resume."""

__version__ = "0.1.0"
