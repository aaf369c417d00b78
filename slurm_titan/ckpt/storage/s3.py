"""A checkpoint location on S3 (or an S3-compatible store) through s3fs.

The endpoint comes from ``endpoint_url=``, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; credentials
from botocore's usual chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, instance roles)
or explicit ``storage_options``. What S3 needs beyond the generic backend is here: the client's
options, the reachability check (one LIST), the conditional PUT (If-None-Match: *) of the commit
record, the folder markers some stores keep, and S3's error codes. Whole files move through s3fs's
``fs.open`` (the fallback for proxies and custom TLS verification); :class:`.s3_http.S3HttpStore`
moves them on the fast http.client path, the default.

Retries are the store's (:mod:`.backoff`: jittered, at least the store's Retry-After, within a deadline): botocore
and s3fs try each small operation once. Left to them, a refused request came back after s3fs's fixed 0.1 s and
botocore's 0-1 s, up to six times, deaf to Retry-After, before the store's policy saw it: at thousands of ranks,
the checks that every rank makes as a save starts, refused together, came back together. Only the fallback's file
streams keep the libraries' retries (:attr:`S3Store.stream_fs`): what s3fs sends inside a file, a part, is
out of the store's reach.

A third path, our own multipart pipeline on s3fs's aiobotocore client, was removed: 256 MiB in 8
files to SeaweedFS on loopback (2 cores, load 5-7, 5 and 7 rounds), it moved no faster than this
fallback (upload 86 and 130 MiB/s against 91 and 96, restore 271 and 356 against 283 and 327; the
medians of the per-round ratios 0.88x up, 0.72x down) while http.client did 98-145 up and 563-644
down. It spent half the client CPU uploading (1.1 against 2.2 CPU s/GiB; restoring 2.2-2.4 against
1.8-2.3), but only where this fallback runs, and it went through the same client, so served a
proxy no better (tools/bench/ckpt_transfer.py --s3-data-path).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

from slurm_titan import envvars
from slurm_titan.ckpt.storage.errors import client_error_code
from slurm_titan.ckpt.storage.fsspec import FsspecStore

_EXISTS_CODES = ("PreconditionFailed", "412", "ConditionalRequestConflict")


def s3_storage_options(endpoint_url: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """s3fs options: endpoint from the argument or AWS_ENDPOINT_URL(_S3); no instance/listing cache;
    a connection pool large enough for parallel multipart transfers."""
    opts: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["endpoint_url"] = endpoint
    config_kwargs: dict[str, Any] = {
        "connect_timeout": 10,
        "read_timeout": 300,
        "max_pool_connections": 64,
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "signature_version": "s3v4",
    }
    if os.environ.get(envvars.CKPT_S3_CHECKSUMS, "0") != "1":
        # Every file is checksummed end to end (xxh3, in the commit record, verified on each
        # restore): botocore's own per-request CRC32 and SHA-256 payload signing would double
        # the client's CPU per byte (measured 4.7 -> 2.4 CPU s/GiB uploading on SeaweedFS).
        config_kwargs.update(request_checksum_calculation="when_required",
                             response_checksum_validation="when_required",
                             s3={"payload_signing_enabled": False})
    client_kwargs: dict[str, Any] = {}
    if endpoint and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        client_kwargs["region_name"] = "us-east-1"
    extra = dict(extra or {})
    config_kwargs.update(extra.pop("config_kwargs", {}) or {})
    client_kwargs.update(extra.pop("client_kwargs", {}) or {})
    opts["config_kwargs"] = config_kwargs
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    opts.update(extra)
    return opts


_STREAM_RETRIES = {"max_attempts": 2, "mode": "standard"}
"""botocore's retries of a request inside a file that s3fs streams (3 tries; s3fs tries each of those twice)."""


class S3Store(FsspecStore):
    """``bucket/prefix`` on an s3fs filesystem; whole files through ``fs.open``."""

    library_retries = False

    def __init__(self, fs: Any, root: str, location: str, **kwargs: Any) -> None:
        super().__init__(fs, root, location, **kwargs)
        fs.retries = 1  # s3fs's default is 5 tries, each botocore's
        self._stream_fs: Any = None
        self._stream_lock = threading.Lock()
        self.request_counts: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self._counting = False

    @property
    def stream_fs(self) -> Any:
        """A second s3fs filesystem, made on first use, with the libraries' retries: a file streamed through it
        has each request inside it (a part) retried there, where the store's policy cannot reach."""
        with self._stream_lock:
            if self._stream_fs is None:
                options = dict(self.fs.storage_options)
                options["config_kwargs"] = {**options.get("config_kwargs", {}), "retries": _STREAM_RETRIES}
                self._stream_fs = type(self.fs)(**options)
                self._stream_fs.retries = 2
            return self._stream_fs

    def bucket_key(self, rel: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(self.full(rel))
        return bucket, key

    def count_requests(self) -> None:
        """Start counting S3 API calls by operation into ``request_counts`` (tests, benchmarks)."""
        if self._counting:
            return
        self._counting = True

        def handler(model: Any = None, **_: Any) -> None:
            with self._count_lock:
                self.request_counts[getattr(model, "name", "?")] += 1

        self.fs.s3.meta.events.register("before-call.s3", handler)

    def _missing_bucket(self, e: FileNotFoundError) -> bool:
        return client_error_code(e) == "NoSuchBucket" or "bucket does not exist" in str(e).lower()

    def _check(self, create: bool) -> None:
        bucket, _, key = self.root.partition("/")
        self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=(key + "/") if key else "", MaxKeys=1)

    def _exists_error(self, e: Exception) -> bool:
        """A conditional PUT (If-None-Match: *) refused: 412, or a conflict with a concurrent one."""
        return (super()._exists_error(e) or client_error_code(e) in _EXISTS_CODES
                or "pre-condition" in str(e).lower())

    def _rm_tree(self, rel: str) -> None:
        path = self.full(rel)
        files = self._rm_found(path)
        # Some stores (SeaweedFS) keep folders as entries of their own that still show up
        # as common prefixes: delete the folder markers too, deepest first.
        dirs = {path}
        for f in files:
            parent = f.rsplit("/", 1)[0]
            while len(parent) > len(path):
                dirs.add(parent)
                parent = parent.rsplit("/", 1)[0]
        bucket = path.split("/", 1)[0]
        keys = [d.split("/", 1)[1] + "/" for d in sorted(dirs, key=lambda d: -d.count("/")) if "/" in d]
        for i in range(0, len(keys), 1000):
            self.fs.call_s3("delete_objects", Bucket=bucket,
                            Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
