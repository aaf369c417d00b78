"""What runs on the compute nodes outside the ranks: the batch shell's modules (node set-up and teardown, the
requeue decision, failure attribution, notifications) and the per-node supervisor's (rendezvous, restore, watchdog,
stack dumps), with the specs the login node writes for them."""
