"""The batch shell's modules (on the batch host, run by the sbatch script by module name, torch-free): the config
check against torchtitan, each attempt's node choice, the step watcher, and after each attempt the verdict (who
failed, restart, requeue or stop) and the alerts. Never imports the node supervisor (the node-processes contract)."""
