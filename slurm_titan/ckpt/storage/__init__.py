"""Checkpoint storage: open a location (a local path or any fsspec URL) as a :class:`Store`.

    store = open_store("s3://bucket/run-1")            # endpoint/credentials from the environment
    store = open_store("/shared/ckpt/run-1", create=True)

The URL picks the backend, once: a path or ``file://`` a :class:`LocalStore`, ``s3://`` an
:class:`S3HttpStore` (files on http.client threads, :mod:`.s3_http`) or, with ``data_path="fsspec"``,
behind a proxy or with SLURM_TITAN_CKPT_FAST_S3=0, an :class:`S3Store` (files through s3fs); any
other scheme an :class:`FsspecStore`. Every failure is a one-line :class:`StoreError` naming the
location (user info stripped) and the cause, known secret values scrubbed. Every operation is retried
under the store's :class:`Backoff` (:mod:`.backoff`): a throttling store is waited out up to
SLURM_TITAN_STORE_RETRY_S seconds per operation, the waits said to ``notice``.

Modules: :mod:`.base` (the Store ABC, Entry, TransferConfig), :mod:`.errors`, :mod:`.backoff` (the
retry policy), :mod:`.concurrency` (requests in flight, adapted to a throttling store), one per backend
(:mod:`.local`, :mod:`.fsspec`, :mod:`.s3`, :mod:`.s3_http`), :mod:`.ranged` (a restored file
filled by ranges: O_DIRECT writes, hashed in order).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from slurm_titan.ckpt.storage.backoff import Backoff, SystemClock, Wait
from slurm_titan.ckpt.storage.base import Entry, Progress, RangeReader, Spans, Store, TransferConfig, Uploaded
from slurm_titan.ckpt.storage.errors import (
    LocalFileError,
    StoreError,
    TransientStoreError,
    describe,
    is_transient,
    redact,
    scrub,
)
from slurm_titan.ckpt.storage.fsspec import FsspecStore
from slurm_titan.ckpt.storage.local import LocalStore
from slurm_titan.ckpt.storage.s3 import S3Store, s3_storage_options
from slurm_titan.ckpt.storage.s3_http import S3HttpStore, usable
from slurm_titan.errors import StorageError

__all__ = [
    "Backoff", "Entry", "FsspecStore", "LocalFileError", "LocalStore", "Progress", "RangeReader", "S3DataPath",
    "S3HttpStore", "S3Store", "Spans", "Store", "StoreError", "SystemClock", "TransferConfig", "TransientStoreError",
    "Uploaded",
    "Wait", "describe", "is_transient", "open_store", "redact", "scrub",
]

S3DataPath = Literal["http", "fsspec"]
"""How an S3 store moves whole files: http.client threads (:mod:`.s3_http`), or s3fs."""

_S3_CLASSES: dict[str, type[S3Store]] = {"http": S3HttpStore, "fsspec": S3Store}

_SECRET_OPTS = ("secret", "key", "token", "password", "aws_secret_access_key", "aws_session_token",
                "aws_access_key_id", "username")


def open_store(location: str, *, endpoint_url: str | None = None, storage_options: dict[str, Any] | None = None,
               check: bool = True, create: bool = False, transfer: TransferConfig | None = None,
               data_path: S3DataPath | None = None, retry: Backoff | None = None,
               notice: Callable[[str], None] | None = None) -> Store:
    """Open LOCATION (a local path, ``file://``, ``s3://bucket/prefix`` or any fsspec URL).

    ``check``: contact the store now (one LIST) and raise a one-line StorageError if it is
    unreachable, refuses the credentials, or (local) does not exist. ``create``: make a
    missing local folder instead of failing. ``data_path`` (S3 only): "http" or "fsspec"; by
    default "http" unless :func:`.s3_http.usable` says no. ``retry``: how its operations are retried
    (default :meth:`Backoff.from_env`); ``notice``: where the waits for a throttling store are said
    (at most one line every 30 s; default the ``slurm_titan.ckpt.storage`` logger's warnings).
    """
    if not location or not str(location).strip():
        raise StorageError("empty checkpoint location")
    location = str(location).strip()
    opts = dict(storage_options or {})
    secrets = tuple(str(opts[k]) for k in _SECRET_OPTS if opts.get(k))
    shown = redact(location)
    store: Store
    if "://" not in location or location.startswith("file://"):
        root = os.path.abspath(os.path.expanduser(location.removeprefix("file://")))
        store = LocalStore(root, root if "://" not in location else shown, transfer=transfer, retry=retry,
                           notice=notice)
    else:
        protocol = location.split("://", 1)[0].lower()
        try:
            import fsspec
        except ImportError as e:  # pragma: no cover
            raise StorageError(f"{shown}: fsspec is not installed ({e})") from None
        s3 = protocol in ("s3", "s3a")
        if s3:
            opts = s3_storage_options(endpoint_url, opts)
        elif endpoint_url:
            opts.setdefault("endpoint_url", endpoint_url)
        try:
            fs, root = fsspec.core.url_to_fs(location, **opts)
        except ImportError as e:
            raise StorageError(f"{shown}: no filesystem for {protocol}:// ({e}); install its fsspec backend") from None
        except Exception as e:  # noqa: BLE001
            raise StorageError(scrub(f"{shown}: cannot open: {describe(e)}", secrets)) from None
        kwargs: dict[str, Any] = dict(endpoint=opts.get("endpoint_url"), transfer=transfer, secrets=secrets,
                                      retry=retry, notice=notice)
        if not s3:
            store = FsspecStore(fs, root, location, **kwargs)
        elif not root.strip("/"):
            raise StorageError(f"{shown}: no bucket in the location")
        else:
            store = _S3_CLASSES[data_path or ("http" if usable(fs) else "fsspec")](fs, root, location, **kwargs)
    if check:
        store.check(create=create)
    return store
