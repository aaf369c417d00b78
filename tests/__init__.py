"""slurm-titan's tests, one folder per kind of part they need:

- unit/<package>/: one package of slurm_titan (or a bottom module, at unit/'s top), no server;
- integration/: SeaweedFS or real torchtitan/torch.distributed in this machine, no Slurm cluster;
- e2e/: the bundled local Slurm cluster (marker `cluster`; with real training, also `train`);
- support/: the helpers and fixtures they share (conftest.py registers the fixtures);
- data/: recordings (npu-smi, hccn_tool, Slurm environments, failure logs, run folders) and the golden plan.
"""
