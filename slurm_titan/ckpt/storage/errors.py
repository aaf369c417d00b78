"""Storage errors: one line, no secrets, and one type that says "worth retrying".

Every backend fails with a :class:`StoreError` (the public methods of :class:`.base.Store` turn
whatever their library raised into one), and with :class:`TransientStoreError`, a StoreError,
where trying again may help: unreachable, timed out, a 5xx answer, throttled. Retrying callers
check that one type (:class:`.backoff.Backoff` is the loop); a throttled answer (503 SlowDown,
429, :data:`_THROTTLE_CODES`) carries the store's code and any ``Retry-After`` it sent.

A local file that cannot be read or written is a :class:`LocalFileError`: not the store's fault,
so never retried. Messages never hold credentials: :func:`redact` strips user info and query
strings from URLs, :func:`scrub` replaces known secret values.
"""

from __future__ import annotations

import errno
import io
import os
import re
import time
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit, urlunsplit

from slurm_titan.errors import StorageError

_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")

_THROTTLE_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "RequestThrottled",
    "ServiceUnavailable", "503", "429",
}
"""Answers of a store that is up and asks for fewer requests (S3, Ceph, MinIO, SeaweedFS, OBS: 503 and 429)."""
_TRANSIENT_CODES = _THROTTLE_CODES | {"RequestTimeout", "RequestTimeTooSkewed", "InternalError", "500", "502", "504"}
_DENIED_CODES = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "403", "AllAccessDisabled", "InvalidClientTokenId",
}
_TRANSIENT_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectorError", "ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
    "IncompleteReadError", "ResponseStreamingError", "HTTPClientError", "ConnectionError",
    "TimeoutError", "ProxyConnectionError", "ServerTimeoutError",
}
_UNREACHABLE_NAMES = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ProxyConnectionError"}
_TRANSIENT_ERRNOS = (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                     errno.EPIPE)


class StoreError(StorageError):
    """The store failed; the message is one line naming the location, with no secrets in it."""

    transient = False
    """True on :class:`TransientStoreError` (kept as an attribute for callers that log by it)."""


class TransientStoreError(StoreError):
    """The store failed in a way worth retrying: unreachable, timed out, 5xx, throttled. The
    only type any retry loop checks; every backend raises it for these causes."""

    transient = True

    def __init__(self, message: str, *, throttle: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.throttle = throttle
        """The store's answer when it throttled (``SlowDown``, ``HTTP 429``); "" for other failures."""
        self.retry_after = retry_after
        """Seconds the store asked to wait (its ``Retry-After``), None when it did not say."""

    @property
    def throttled(self) -> bool:
        return bool(self.throttle)

    def reworded(self, message: str) -> TransientStoreError:
        """The same failure under another message (with the location and the object in it)."""
        return TransientStoreError(message, throttle=self.throttle, retry_after=self.retry_after)


class LocalFileError(StorageError):
    """A local file could not be read or written (not a storage problem; not retried)."""


def open_local(path: str) -> io.FileIO:
    """``path`` opened for reading, unbuffered (callers read large blocks); LocalFileError if it cannot be."""
    try:
        return open(path, "rb", buffering=0)
    except OSError as e:
        raise LocalFileError(f"cannot read {path}: {e.strerror}") from None


def redact(location: str) -> str:
    """A location fit for logs: user info and query strings removed."""
    if "://" not in location:
        return location
    try:
        parts = urlsplit(location)
    except ValueError:
        return re.sub(r"//[^/@]*@", "//***@", location.split("?", 1)[0])
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_urls(text: str) -> str:
    """``text`` with the user info and query strings of any URL in it removed."""
    return re.sub(r"(\w+://)[^/\s@\"']*@", r"\1***@", re.sub(r"(https?://[^\s\"'?]+)\?[^\s\"']*", r"\1", text))


def scrub(text: str, extra_secrets: tuple[str, ...] = ()) -> str:
    """Replace any known secret value (from the environment or given) in ``text``."""
    for value in [os.environ.get(k) for k in _SECRET_ENV] + list(extra_secrets):
        if value and len(value) >= 4 and value in text:
            text = text.replace(value, "***")
    return text


def client_error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError (or of the error it caused), else ''."""
    for e in (exc, exc.__cause__, exc.__context__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = resp.get("Error", {}).get("Code")
            if code:
                return str(code)
    return ""


def throttle_code(exc: BaseException) -> str:
    """The store's code when ``exc`` is a throttled answer (a TransientStoreError's, or a botocore
    ClientError's: SlowDown, 429, ...), else ''."""
    if isinstance(exc, TransientStoreError):
        return exc.throttle
    code = client_error_code(exc)
    if code in _THROTTLE_CODES:
        return code
    # s3fs turns SlowDown into OSError(EBUSY, "Please reduce your request rate."), its ClientError dropped
    return "SlowDown" if isinstance(exc, OSError) and exc.errno == errno.EBUSY else ""


def throttle_answer(status: int, code: str) -> str:
    """``code`` when a store's HTTP answer (``status``, its error ``code``) says that it throttles, else ''."""
    return code if code in _THROTTLE_CODES or status in (429, 503) else ""


def retry_after(exc: BaseException) -> float | None:
    """The ``Retry-After`` of the answer behind ``exc`` (a botocore ClientError's headers), in seconds."""
    if isinstance(exc, TransientStoreError):
        return exc.retry_after
    for e in (exc, exc.__cause__, exc.__context__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            return parse_retry_after(headers.get("retry-after"))
    return None


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds, or an HTTP date) as seconds from now; None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (a StoreError or any library's exception) is worth retrying."""
    if isinstance(exc, StoreError):
        return exc.transient
    code = client_error_code(exc)
    if code:
        return code in _TRANSIENT_CODES
    if {c.__name__ for c in type(exc).__mro__} & _TRANSIENT_NAMES:
        return True
    return isinstance(exc, OSError) and (exc.errno in _TRANSIENT_ERRNOS or bool(throttle_code(exc)))


def describe(exc: BaseException, endpoint: str | None = None) -> str:
    """One line saying why a storage call failed (URLs redacted, secrets scrubbed)."""
    code = client_error_code(exc)
    names = {c.__name__ for c in type(exc).__mro__}
    if names & _UNREACHABLE_NAMES or (isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
        cause = f"cannot connect to {endpoint}" if endpoint else "cannot connect to the storage endpoint"
        cause += " (unreachable or not running)"
    elif code in _DENIED_CODES or isinstance(exc, PermissionError):
        cause = f"access denied ({code or 'permission error'}); check the credentials and the bucket policy"
    elif code == "NoSuchBucket" or "bucket does not exist" in str(exc).lower():
        cause = "the bucket does not exist"
    else:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        cause = f"{type(exc).__name__}: {msg}" if msg != type(exc).__name__ else msg
        if code and code not in cause:
            cause = f"{code}: {cause}"
    if len(cause) > 300:
        cause = cause[:297] + "..."
    return scrub(redact_urls(cause))
