"""What the tests share. tests/conftest.py registers the fixtures of cli, cluster, s3, throttle and ckpt as plugins;
tests import the helpers by name (never from conftest).

- paths: the repository's folders, and the environment of a child Python that imports this checkout;
- cli: `run` a command, `wait_for` a condition, `Cli` (the real `slurm-titan` against the cluster and S3);
- cluster: the bundled Slurm cluster as a `LocalCluster` (fixtures `cluster`, `slurm_env`);
- s3: a private SeaweedFS (`S3Server`; fixtures `s3_server`, `s3_env`);
- throttle: the throttling S3 proxy of tools/local_s3 in a child process (`ThrottleProxy`; fixture `throttled_s3`);
- ckpt: fake DCP step folders and the `location` fixture (a directory, or S3);
- runs: what the end-to-end tests read from a job's logs and steer it with;
- recorded: the recorded run folders of tests/data/runs; plans: the pinned debug-cpu config;
  reports: node reports as the supervisor writes them;
- dcp_share_worker, streamed_dataset: programs the tests start (a DCP rank, a torchtitan override).
"""
