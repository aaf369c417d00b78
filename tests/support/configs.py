"""The debug config the end-to-end tests submit, and the smaller batch that most of their runs train with."""

DEBUG_CONFIG = "configs/debug_cpu.yaml"
SEQ_LEN, LOCAL_BATCH = 128, 2
SMALL_STEPS = [DEBUG_CONFIG, "--set", f"torchtitan.args.training.seq_len={SEQ_LEN}",
               "--set", f"torchtitan.args.training.local_batch_size={LOCAL_BATCH}"]
"""The debug config with a quarter of its tokens a step (llama3_debugmodel on one CPU thread: 0.15 s of CPU a
step instead of 0.59 s). Runs whose faults land at a step are paced besides (`Cli.submit(paced=True)`: >= 1 s a
step however fast the machine, so that a signal lands mid-run and a checkpoint is committed a few steps after it
was saved). Only the slow-node runs keep the config's 4 x 256 tokens (tests.support.references.SLOW_NODE_STEPS):
a throttled node's steps must cost enough that swapping it pays."""
