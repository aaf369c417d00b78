"""The `slurm-titan` command line: `main` builds the parser from one module per command, each a `base.SubCommand`."""
