"""Inside each training process (imports torch/torchtitan): the rank's entry point, the checkpoint hook torchtitan
loads (upload, agreed stop, progress for the watchdog, restore gate), the preemption signals, device set-up."""
