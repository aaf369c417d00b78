"""The bundled Slurm cluster (`tools/local-cluster`): `cluster.LocalCluster` (up, down, status, env, kill a
node), its command line in `cli`, the /proc readers in `procs`, its config templates, and, in `faults`, real
faults injected into its jobs for the end-to-end tests and the fault benchmarks."""
