"""The data position and the dataset fingerprint that a checkpoint carries (torch-free; used inside the ranks by
the resharding data loader of overrides/)."""
