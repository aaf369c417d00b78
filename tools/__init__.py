"""The repository's tools, importable as packages from the repository root (no sys.path edits): local_cluster
(the bundled Slurm cluster), local_s3 (a SeaweedFS store), bench (benchmarks, run as `python -m tools.bench.NAME`).
The shims tools/local-cluster and tools/local-s3 run their command line modules the same way."""
