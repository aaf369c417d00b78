"""The bundled Slurm cluster (`tools/local-cluster`): its config templates and, in `faults`, real faults
injected into its jobs for the end-to-end tests and the fault benchmarks."""
