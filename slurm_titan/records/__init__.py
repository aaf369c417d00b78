"""The files that processes of a run write and others read (torch-free, used on every machine): the run history,
the job registry, the node ledger, the job folder's map, each rank's progress record and the restore verdicts."""
