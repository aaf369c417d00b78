"""What runs on the compute nodes outside the ranks, one subpackage per process: `batch/` (the batch shell) and
`supervisor/` (the node supervisor, one per node). Below both, what they share and what the login node writes
for them: `spec` (the supervisor's pickled NodeSpec), `budgets` (the watchdog's phase budgets), `notify_config`
(the `notify:` section), `node_log` (the node log's line), `srun_probe` (does a node answer), `culprit` (which
hung rank is the stuck one)."""
