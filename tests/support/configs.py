"""The debug config the end-to-end tests submit, and the smaller batch that most of their runs train with."""

DEBUG_CONFIG = "configs/debug_cpu.yaml"
SEQ_LEN, LOCAL_BATCH = 128, 2
SMALL_STEPS = [DEBUG_CONFIG, "--set", f"torchtitan.args.training.seq_len={SEQ_LEN}",
               "--set", f"torchtitan.args.training.local_batch_size={LOCAL_BATCH}"]
"""The debug config with a quarter of its tokens a step (llama3_debugmodel on one CPU thread: 0.15 s of CPU a
step instead of 0.59 s), for the runs that train to the end before anything is asserted of them. Runs whose
faults land at a step keep the config's 4 x 256 tokens (tests.support.references.SIXTY_STEPS, test_recovery,
test_hang): a signal must land mid-run, a throttled node must be worth a swap, a checkpoint must be committed
a few steps after it was saved."""
