"""Alerts from the batch shell: each format's body on a local receiver, bounded tries, no URL anywhere."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurm_titan.envvars import NOTIFY as NOTIFY_ENV
from slurm_titan.node.batch import notify
from slurm_titan.node.batch.outcome import REQUEUE, RESTART, STOP, Outcome
from slurm_titan.node.notify_config import EVENTS, NotifySpec, WebhookSpec

JOB = notify.JobRef("4242", "llama-70b")
SECRET = "T000-SECRET-TOKEN"


@dataclass
class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records each POST and answers `status` with `reply`."""

    status: int = 200
    reply: bytes = b"ok"
    posts: list[tuple[str, dict[str, str], dict]] = field(default_factory=list)
    port: int = 0

    def url(self, path: str = f"/hook/{SECRET}?access_token={SECRET}") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.posts.append((self.path, dict(self.headers), json.loads(body)))
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(state.reply)))
            self.end_headers()
            self.wfile.write(state.reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy_no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(notify, "RETRY_PAUSE_S", 0.0)


def spec_for(monkeypatch: pytest.MonkeyPatch, fmt: str, url: str, events: list[str] | None = None,
             timeout_s: int = 5) -> NotifySpec:
    var = f"{fmt.upper()}_WEBHOOK_URL"
    monkeypatch.setenv(var, url)
    hook = WebhookSpec(fmt, var, events if events is not None else list(EVENTS))
    return NotifySpec(webhooks=[hook], timeout_s=timeout_s)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text and "127.0.0.1" not in text


@pytest.mark.parametrize(("fmt", "reply", "expected"), [
    ("slack", b"ok", {"text": "slurm-titan: llama-70b (job 4242): failed: exit code 1 on node-3"}),
    ("feishu", b'{"code":0,"msg":"success","data":{}}',
     {"msg_type": "text", "content": {"text": "slurm-titan: llama-70b (job 4242): failed: exit code 1 on node-3"}}),
    ("dingtalk", b'{"errcode":0,"errmsg":"ok"}',
     {"msgtype": "text", "text": {"content": "slurm-titan: llama-70b (job 4242): failed: exit code 1 on node-3"}}),
])
def test_each_format_posts_its_documented_body(receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], fmt: str, reply: bytes,
                                               expected: dict) -> None:
    receiver.reply = reply
    notify.send("failed", JOB, "exit code 1 on node-3", spec_for(monkeypatch, fmt, receiver.url()))
    [(path, headers, body)] = receiver.posts
    assert body == expected
    assert path == f"/hook/{SECRET}?access_token={SECRET}"
    assert headers["Content-Type"].startswith("application/json")
    assert capsys.readouterr().err == ""


def test_generic_json_carries_the_event_as_fields(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    notify.send("node excluded", JOB, "node-3: ECC errors", spec_for(monkeypatch, "json", receiver.url()))
    [(_, _, body)] = receiver.posts
    assert {key: body[key] for key in ("source", "event", "job_id", "job_name", "details")} == {
        "source": "slurm-titan", "event": "node excluded", "job_id": "4242", "job_name": "llama-70b",
        "details": "node-3: ECC errors"}
    assert body["host"] == socket.gethostname()
    assert body["text"].startswith("slurm-titan: llama-70b (job 4242): node excluded")


def test_only_the_webhooks_that_hear_the_event_get_it(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_for(monkeypatch, "slack", receiver.url(), events=["failed", "restart loop"])
    notify.send("completed", JOB, "", spec)
    notify.send("restart loop", JOB, "3 failed attempts in a row", spec)
    assert [body["text"] for _, _, body in receiver.posts] == [
        "slurm-titan: llama-70b (job 4242): restart loop: 3 failed attempts in a row"]


def test_a_silent_endpoint_is_tried_twice_then_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:  # accepts and never says a word
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook/{SECRET}"
    try:
        notify.send("failed", JOB, "x", spec_for(monkeypatch, "slack", url, timeout_s=1))
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert len(accepted) == 2  # one try, one retry: no storm
    err = capsys.readouterr().err
    assert err == "slurm-titan: WARNING: notify: slack webhook $SLACK_WEBHOOK_URL: 'failed' not delivered: " \
                  "no answer within 1 s\n"


def test_send_stops_waiting_at_its_deadline(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    never = threading.Event()
    monkeypatch.setattr(notify, "_post", lambda *args: never.wait())
    monkeypatch.setattr(notify, "deadline_s", lambda spec: 0.05)
    notify.send("failed", JOB, "", spec_for(monkeypatch, "json", f"http://127.0.0.1:9/{SECRET}"))
    never.set()
    assert capsys.readouterr().err.endswith("'failed' not delivered: no answer within 0.05 s\n")


def test_a_refused_connection_is_one_warning(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed again: nothing listens there
    notify.send("completed", JOB, "", spec_for(monkeypatch, "dingtalk", f"http://127.0.0.1:{port}/x?t={SECRET}"))
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("slurm-titan: WARNING: notify: dingtalk webhook $DINGTALK_WEBHOOK_URL: 'completed' not "
                          "delivered: cannot connect (")
    assert_no_secret(err)


def test_server_errors_are_retried_once_refusals_never(receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    receiver.status = 503
    notify.send("failed", JOB, "", spec_for(monkeypatch, "slack", receiver.url()))
    assert len(receiver.posts) == 2
    receiver.status, receiver.posts = 404, []
    notify.send("failed", JOB, "", spec_for(monkeypatch, "slack", receiver.url()))
    assert len(receiver.posts) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.rsplit(": ", 1)[1] for line in err] == ["HTTP 503 Service Unavailable", "HTTP 404 Not Found"]
    assert_no_secret(*err)


@pytest.mark.parametrize(("fmt", "reply", "problem"), [
    ("dingtalk", b'{"errcode":310000,"errmsg":"keywords not in content"}', "errcode 310000 keywords not in content"),
    ("feishu", b'{"code":19024,"msg":"Key Words Not Found"}', "code 19024 Key Words Not Found"),
])
def test_a_robot_refusal_inside_http_200_is_a_warning(receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], fmt: str, reply: bytes,
                                                      problem: str) -> None:
    receiver.reply = reply
    notify.send("failed", JOB, "", spec_for(monkeypatch, fmt, receiver.url()))
    assert len(receiver.posts) == 1
    assert capsys.readouterr().err.rstrip().endswith(f"not delivered: refused: {problem}")


def test_unset_variable_is_one_warning_when_sending(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("OPS_HOOK", raising=False)
    notify.send("failed", JOB, "", NotifySpec(webhooks=[WebhookSpec("json", "OPS_HOOK")]))
    assert capsys.readouterr().err == (f"slurm-titan: WARNING: notify: json webhook $OPS_HOOK is not set on "
                                       f"{socket.gethostname()}: 'failed' not sent\n")


@pytest.mark.parametrize("url", [f"ftp://host/{SECRET}", f"hooks.slack.com/services/{SECRET}", SECRET])
def test_a_variable_without_an_http_url_is_a_warning_without_its_value(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str) -> None:
    notify.send("failed", JOB, "", spec_for(monkeypatch, "slack", url))
    err = capsys.readouterr().err
    assert err.endswith("not delivered: $SLACK_WEBHOOK_URL does not hold an http(s) URL\n")
    assert SECRET not in err


def test_an_error_that_quotes_the_url_is_redacted(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = f"https://hooks.example.com/services/{SECRET}"

    def urlopen(request: object, timeout: float) -> None:
        raise ValueError(f"bad request to {url} (path /services/{SECRET})")

    monkeypatch.setattr(notify.urllib.request, "urlopen", urlopen)
    notify.send("failed", JOB, "", spec_for(monkeypatch, "slack", url))  # never raises
    err = capsys.readouterr().err
    assert err.endswith("not delivered: ValueError: bad request to <url> (path <url>)\n")
    assert SECRET not in err


def test_spec_round_trips_through_the_batch_shell_environment() -> None:
    spec = NotifySpec(webhooks=[WebhookSpec("feishu", "FEISHU_URL", ["failed"])], timeout_s=3)
    assert notify.spec_from_env(spec.node_env()) == NotifySpec(webhooks=spec.webhooks, timeout_s=3)
    assert notify.spec_from_env({}) is None
    assert NotifySpec().node_env() == {}


def test_a_malformed_spec_is_one_warning_and_no_alerts(capsys: pytest.CaptureFixture[str]) -> None:
    assert notify.spec_from_env({NOTIFY_ENV: '{"webhooks": [{"format": "slack"}]}'}) is None
    assert capsys.readouterr().err == \
        f"slurm-titan: WARNING: notify: ${NOTIFY_ENV} is malformed (TypeError); no alerts are sent\n"


def test_an_unknown_event_is_a_warning_not_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    notify.send("exploded", JOB, "", NotifySpec(webhooks=[WebhookSpec("json", "X")]))
    assert "unknown event 'exploded'" in capsys.readouterr().err


@pytest.mark.parametrize(("outcome", "event"), [
    (Outcome("finished", STOP), "completed"),
    (Outcome("failed", RESTART), "failed"),
    (Outcome("failed", STOP, "max_failures=20 reached"), "failed"),
    (Outcome("preflight failed", STOP), "failed"),
    (Outcome("restart loop", STOP), "restart loop"),
    (Outcome("timed out", STOP, "max_requeues=20 reached"), "failed"),
    (Outcome("preempted", REQUEUE), None),
])
def test_outcome_event(outcome: Outcome, event: str | None) -> None:
    assert notify.outcome_event(outcome) == event


def test_job_ref_from_the_batch_shell() -> None:
    assert notify.JobRef.from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "run"}) == notify.JobRef("7", "run")
