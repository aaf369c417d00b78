"""The login node's side of a job (no torch): read and validate the YAML config, plan the job (sbatch script,
node spec, environment), submit it through submitit, and answer `status`, `logs`, `runs` from what runs leave."""
