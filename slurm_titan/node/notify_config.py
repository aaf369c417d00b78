"""The `notify:` section: who hears about a run's events, checked before anything is submitted.

Two channels:

- webhooks, sent from where the job runs (`slurm_titan.node.batch.notify`): each names its message `format` and
  the environment variable that holds its URL (`url_env`). A webhook URL is a secret: the config, the sbatch
  script, the logs and the run's records carry only the variable's name; sbatch's default environment
  propagation (`--export=ALL`, sbatch(1)) carries the value from the submitting shell to the batch shell;
- Slurm's own mail (sbatch `--mail-type` / `--mail-user`, sbatch(1): "Notify user by email when certain event
  types occur"), for what Slurm itself sees: `requeued` -> REQUEUE, `failed` -> FAIL, `completed` -> END
  (Slurm's END mail comes at any end of the job, FAIL only at a failed one). `mail.user` defaults to the
  submitting user (sbatch(1)).

    notify:
      webhooks:
        - {format: slack, url_env: SLACK_WEBHOOK_URL, events: [failed, restart loop]}
      mail: {user: ops@example.com, events: [failed, completed]}
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from slurm_titan import envvars
from slurm_titan.errors import ConfigError

EVENTS = ("requeued", "failed", "hang detected", "slow node", "node excluded", "restart loop", "completed")
MAIL_TYPES = {"requeued": "REQUEUE", "failed": "FAIL", "completed": "END"}
"""The events Slurm itself knows, with the `--mail-type` value that mails them."""
WebhookFormat = Literal["json", "slack", "feishu", "dingtalk"]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAIL_USER = re.compile(r"^[A-Za-z0-9._%+@-]+(?:,[A-Za-z0-9._%+@-]+)*$")
_ALL_EXPORTED = re.compile(r"^ALL(?:,|$)")


@dataclass
class WebhookSpec:
    """One webhook: its message format, the variable holding its URL, the events it hears (default: all)."""

    format: WebhookFormat
    url_env: str
    events: list[str] = field(default_factory=lambda: list(EVENTS))

    def describe(self) -> str:
        """How logs and errors name this webhook: its format and variable, never its URL."""
        return f"{self.format} webhook ${self.url_env}"


@dataclass
class MailSpec:
    """Slurm's mail: on for the `events` listed (of requeued, failed, completed)."""

    events: list[str] = field(default_factory=list)
    user: str | None = None


@dataclass
class NotifySpec:
    """Webhooks and Slurm's mail; `timeout_s` bounds each try of a webhook (one retry at most)."""

    webhooks: list[WebhookSpec] = field(default_factory=list)
    mail: MailSpec = field(default_factory=MailSpec)
    timeout_s: int = 5

    def mail_type(self) -> str | None:
        """sbatch's `--mail-type` value, None when mail is off."""
        return ",".join(MAIL_TYPES[event] for event in MAIL_TYPES if event in self.mail.events) or None

    def node_env(self) -> dict[str, str]:
        """What the batch shell exports for `slurm_titan.node.batch.notify` (nothing without webhooks)."""
        if not self.webhooks:
            return {}
        data = {"webhooks": [dataclasses.asdict(hook) for hook in self.webhooks], "timeout_s": self.timeout_s}
        return {envvars.NOTIFY: json.dumps(data, separators=(",", ":"))}

    @classmethod
    def from_node_env(cls, text: str) -> NotifySpec:
        """The spec `node_env` wrote (webhooks only). Raises ValueError (or TypeError) if it is malformed."""
        data = json.loads(text)
        return cls(webhooks=[WebhookSpec(**hook) for hook in data["webhooks"]], timeout_s=int(data["timeout_s"]))


def _check_events(where: str, key: str, events: list[str], allowed: tuple[str, ...], hint: str) -> None:
    for index, event in enumerate(events):
        if event not in allowed:
            close = difflib.get_close_matches(event, allowed, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(where, f"{key}[{index}]", f"unknown event {event!r}{suggestion}; {hint}")


def check_notify(where: str, spec: NotifySpec, node_env: Mapping[str, str]) -> None:
    """ConfigError for a bad `notify` section; `node_env` is `environment.env` (written into the script)."""
    if not 1 <= spec.timeout_s <= 60:
        raise ConfigError(where, "notify.timeout_s", f"must be 1..60 s, got {spec.timeout_s}")
    for index, hook in enumerate(spec.webhooks):
        key = f"notify.webhooks[{index}]"
        if not _ENV_NAME.match(hook.url_env):  # never echo it: it may be the URL itself
            raise ConfigError(where, f"{key}.url_env", "must name the environment variable that holds the URL "
                                                       "(letters, digits, '_'), not hold the URL")
        if hook.url_env in node_env:
            raise ConfigError(where, f"environment.env.{hook.url_env}",
                              f"holds the URL of {key} and would be written into the sbatch script; "
                              "set it in the environment you submit from instead")
        _check_events(where, f"{key}.events", hook.events, EVENTS, f"events are {', '.join(EVENTS)}")
    _check_events(where, "notify.mail.events", spec.mail.events, tuple(MAIL_TYPES),
                  f"Slurm mails only for {', '.join(MAIL_TYPES)}; send the others through a webhook")
    if spec.mail.user is not None:
        if not spec.mail.events:
            raise ConfigError(where, "notify.mail.user", "is set but notify.mail.events is empty")
        if not _MAIL_USER.match(spec.mail.user):
            raise ConfigError(where, "notify.mail.user", f"{spec.mail.user!r} is not a user or mail address "
                                                         "(sbatch --mail-user)")


def submit_warnings(where: str, spec: NotifySpec, environ: Mapping[str, str], export: str | None) -> list[str]:
    """One line per webhook whose URL this job may not get: its variable is unset here, or sbatch's
    `--export` (`slurm.extra.export`) does not pass it on. The job may still get it on the nodes (a set-up
    line that sources it), so these are warnings."""
    lines = []
    for index, hook in enumerate(spec.webhooks):
        key = f"{where}: notify.webhooks[{index}].url_env"
        if not environ.get(hook.url_env):
            lines.append(f"{key}: ${hook.url_env} is not set here; the {hook.format} webhook gets its URL only "
                         "if the job's environment on the nodes sets it")
        elif export is not None and not _ALL_EXPORTED.match(export) and hook.url_env not in export.split(","):
            lines.append(f"{key}: slurm.extra.export={export!r} does not pass ${hook.url_env} on to the job")
    return lines
