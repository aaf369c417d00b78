"""The debug config the end-to-end tests submit, and the smaller batch that most of their runs train with."""

DEBUG_CONFIG = "configs/debug_cpu.yaml"
SEQ_LEN, LOCAL_BATCH = 64, 2
SMALL_STEPS = [DEBUG_CONFIG, "--set", f"torchtitan.args.training.seq_len={SEQ_LEN}",
               "--set", f"torchtitan.args.training.local_batch_size={LOCAL_BATCH}"]
"""The debug config with an eighth of its tokens a step (llama3_debugmodel on one CPU thread, 2 ranks on 2
cores, measured 2026-12-07: 0.23 CPU-seconds a rank's step against 0.34 with 2 x 128 tokens; most of what is left
is FSDP's gathers and reductions and the optimizer, which the tokens do not change). Runs whose faults land at a
step are paced besides (`Cli.submit(paced=True)`: >= 1 s a step however fast the machine, so that a signal lands
mid-run and a checkpoint is committed a few steps after it was saved). Only the slow-node runs keep the config's
4 x 256 tokens (tests.support.references.SLOW_NODE_STEPS): a throttled node's steps must cost enough that swapping
it pays."""
