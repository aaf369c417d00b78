"""Text templates of what a job runs, rendered from the job config (package ``slurm_titan.launch.templates``)."""
