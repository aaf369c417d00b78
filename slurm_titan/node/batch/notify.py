"""A run's alerts to webhooks, sent from the batch shell (`slurm_titan.node.batch.finish`) where the job runs.

`send(event, job, details, spec)` posts one message to every webhook of `spec` that hears `event`, each in
its own thread, and returns within `deadline_s(spec)` whatever the endpoints do: one try of at most
`timeout_s`, one retry after a failure that another try may cure (no answer, a refused connection, HTTP 5xx),
none after a refusal (HTTP 4xx, an error code in the reply). A webhook that fails is one warning line on
stderr, never an error of the run. The URL is read from the webhook's variable here, at sending time, and
never printed: warnings name the format and the variable.

Message bodies, as each service documents its incoming webhook:

- `slack`: `{"text": ...}` (Slack, "Sending messages using incoming webhooks",
  https://api.slack.com/messaging/webhooks: `curl -X POST -H 'Content-type: application/json'
  --data '{"text":"Hello, World!"}'`); Slack answers errors with HTTP 4xx;
- `feishu` (Lark): `{"msg_type": "text", "content": {"text": ...}}` (Feishu custom bot,
  https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot); it answers HTTP 200 with
  `{"code": 0, "msg": "success"}`, or a non-zero `code` (older bots: `StatusCode`) when it refuses;
- `dingtalk`: `{"msgtype": "text", "text": {"content": ...}}` (DingTalk custom robot,
  https://open.dingtalk.com/document/robots/custom-robot-access); it answers HTTP 200 with `{"errcode": 0}`,
  or a non-zero `errcode` when it refuses. A robot with the "custom keywords" security setting needs one of
  its keywords in every message: every message starts with "slurm-titan";
- `json`: the event as fields: `{"source": "slurm-titan", "event", "job_id", "job_name", "host", "time",
  "details", "text"}`.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from slurm_titan.envvars import NOTIFY
from slurm_titan.node.batch.outcome import REQUEUE, SLOW_NODE, Outcome
from slurm_titan.node.notify_config import EVENTS, NotifySpec, WebhookSpec

RETRY_PAUSE_S = 1.0
_REPLY_LIMIT = 65536


@dataclass(frozen=True)
class JobRef:
    """The job an alert is about."""

    id: str
    name: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobRef:
        """The batch shell's job (Slurm's SLURM_JOB_ID and SLURM_JOB_NAME)."""
        return cls(env.get("SLURM_JOB_ID", "?"), env.get("SLURM_JOB_NAME", "?"))


def spec_from_env(env: Mapping[str, str]) -> NotifySpec | None:
    """The webhooks the plan exported (`envvars.NOTIFY`), None without any."""
    text = env.get(NOTIFY)
    if not text:
        return None
    try:
        return NotifySpec.from_node_env(text)
    except (ValueError, TypeError, KeyError) as error:
        _warn(f"${NOTIFY} is malformed ({type(error).__name__}); no alerts are sent")
        return None


def outcome_event(outcome: Outcome) -> str | None:
    """The event an attempt's outcome is (`finish.conclude`), None for a requeue (the requeue sends its own) and
    a slow node's swap (its `slow node` alert went when it was named)."""
    if outcome.action == REQUEUE or outcome.reason == SLOW_NODE:
        return None
    return {"finished": "completed", "restart loop": "restart loop"}.get(outcome.reason, "failed")


def deadline_s(spec: NotifySpec) -> float:
    """The longest `send` blocks: a try, the pause, the retry."""
    return 2 * spec.timeout_s + RETRY_PAUSE_S + 1


def send(event: str, job: JobRef, details: str, spec: NotifySpec | None) -> None:
    """Post `event` to the webhooks of `spec` that hear it; never raises, returns within `deadline_s(spec)`."""
    if event not in EVENTS:  # a caller's bug: still never a failure of the run
        _warn(f"unknown event {event!r} (events are {', '.join(EVENTS)}); not sent")
        return
    hooks = [hook for hook in spec.webhooks if event in hook.events] if spec else []
    if not spec or not hooks:
        return
    text = f"slurm-titan: {job.name} (job {job.id}): {event}" + (f": {details}" if details else "")
    fields = {"source": "slurm-titan", "event": event, "job_id": job.id, "job_name": job.name,
              "host": socket.gethostname(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "details": details,
              "text": text}
    results: dict[int, str | None] = {}  # filled by each webhook's thread: None when delivered
    threads = []
    for index, hook in enumerate(hooks):
        url = os.environ.get(hook.url_env, "")
        if not url:
            _warn(f"{hook.describe()} is not set on {socket.gethostname()}: {event!r} not sent")
            continue
        body = json.dumps(body_for(hook.format, text, fields)).encode()
        thread = threading.Thread(target=_post, args=(hook, url, body, spec.timeout_s, results, index),
                                  name=f"notify-{hook.url_env}", daemon=True)
        thread.start()
        threads.append((index, hook, thread))
    end = time.monotonic() + deadline_s(spec)
    for index, hook, thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
        problem = results.get(index, f"no answer within {deadline_s(spec):g} s")
        if problem:
            _warn(f"{hook.describe()}: {event!r} not delivered: {problem}")


def body_for(fmt: str, text: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON body a webhook of format `fmt` takes (see the module's docstring)."""
    if fmt == "slack":
        return {"text": text}
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if fmt == "dingtalk":
        return {"msgtype": "text", "text": {"content": text}}
    return fields


def _post(hook: WebhookSpec, url: str, body: bytes, timeout_s: int, results: dict[int, str | None],
          key: int) -> None:
    """POST `body` (a retry at most); `results[key]` is None when delivered, else what went wrong, without
    the URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        results[key] = f"${hook.url_env} does not hold an http(s) URL"
        return
    problem = None
    for tried in range(2):
        if tried:
            time.sleep(RETRY_PAUSE_S)
        retry, problem = _try(hook, url, body, timeout_s)
        if problem is None or not retry:
            break
    results[key] = problem and _redact(problem, url)


def _try(hook: WebhookSpec, url: str, body: bytes, timeout_s: int) -> tuple[bool, str | None]:
    """One POST: (whether another try may help, the problem or None)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json; charset=utf-8"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return False, _refusal(hook.format, reply.read(_REPLY_LIMIT))
    except urllib.error.HTTPError as error:
        return error.code >= 500, f"HTTP {error.code} {error.reason}"
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError):
            return True, f"no answer within {timeout_s} s"
        return True, f"cannot connect ({getattr(reason, 'strerror', None) or reason})"
    except TimeoutError:
        return True, f"no answer within {timeout_s} s"
    except (OSError, http.client.HTTPException) as error:  # a connection reset, a garbled reply
        return True, f"{type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - a malformed URL, ...: never a failure of the run; may quote the URL
        return False, f"{type(error).__name__}: {error}"


def _refusal(fmt: str, reply: bytes) -> str | None:
    """The error a Feishu or DingTalk robot reports inside an HTTP 200 reply, None when it took the message."""
    if fmt not in ("feishu", "dingtalk"):
        return None
    try:
        data = json.loads(reply)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    code_key, message_key = ("errcode", "errmsg") if fmt == "dingtalk" else \
        (("code", "msg") if "code" in data else ("StatusCode", "StatusMessage"))
    code = data.get(code_key, 0)
    return f"refused: {code_key} {code} {str(data.get(message_key, ''))[:200]}".rstrip() if code else None


def _redact(text: str, url: str) -> str:
    """`text` without the URL or its secret parts (path, query), whatever quoted them."""
    parts = urlsplit(url)
    for secret in (url, parts.path + (f"?{parts.query}" if parts.query else ""), parts.query, parts.path):
        if len(secret) > 1:
            text = text.replace(secret, "<url>")
    return text


def _warn(message: str) -> None:
    print(f"slurm-titan: WARNING: notify: {message}", file=sys.stderr, flush=True)
