"""The many-rank harness (issue 24): the project's own checkpoint, restore, agreement, probe and status code at
64-4,096 simulated ranks, against real servers with injected limits; a benchmark, not a timed test.

    .venv/bin/python -m tools.bench.scale_sim                          # every part, N = 64 ... 512
    .venv/bin/python -m tools.bench.scale_sim --parts store --ranks 64 128 --json /tmp/scale.json

One module a part, each with ``measure(ranks, workdir) -> dict`` (one row of figures at ``ranks`` simulated ranks,
8 a node) and ``GOALS`` (what the issue asks of them): :mod:`.store` (save, commit, restore, list and prune of
llama3 70B with AdamW through the throttling S3 proxy in front of SeaweedFS), :mod:`.folder` (the job folder's
agreement and heartbeats on a file system that counts and delays metadata operations), :mod:`.slurm` (probe rounds
and status queries against srun/scontrol/squeue/sacct shims that count, serialize and delay). :mod:`.goals` fits
each figure's growth over the ranks run and judges it at 4,096 ranks, saying which figures ran and which are fitted.
"""
