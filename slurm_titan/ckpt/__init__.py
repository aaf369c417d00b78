"""Checkpoint storage for slurm-titan: upload, commit, catalog, verify, restore, retention.

torchtitan writes each checkpoint as DCP shards into ``<local>/step-N/`` on fast node-local
disk; :mod:`slurm_titan.ckpt.sync` uploads every rank's own files to the run's remote
location in the background and rank 0 writes the commit record last, atomically.
A checkpoint is *complete* only when its commit record exists.

Modules (each with one job):

- :mod:`.layout`     names of things inside a checkpoint location
- :mod:`.checksum`   file checksums (xxh3_128, or sha256 without xxhash)
- :mod:`.manifest`   the commit record and the per-rank receipt (JSON, path-checked)
- :mod:`.storage`    open a location (URL or path) as a Store: one interface, one module per
                     backend (local folder, any fsspec, S3 and its fast http.client path), with
                     checksummed bulk upload/download and ranged O_DIRECT restores
- :mod:`.sync`       per-rank background uploader and rank-0 committer
- :mod:`.uploader`   a rank's CheckpointSync in a child process (outside training's GIL)
- :mod:`.background` the uploader's priority and CPUs
- :mod:`.catalog`    list / show / verify / restore
- :mod:`.retention`  which checkpoints to keep, and pruning
- :mod:`.resume`     before a (re)start: newest complete checkpoint onto a node's local disk
- :mod:`.commands`   the ``slurm-titan ckpt ...`` CLI
- :mod:`.titan_hook` the torchtitan ``@override`` (the only module importing torch)

Nothing here but ``titan_hook`` imports torch or torchtitan, so the CLI stays light.
"""
