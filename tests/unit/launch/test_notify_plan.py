"""The `notify:` section: checked before submitting, Slurm's mail in the sbatch script, webhook URLs kept out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_titan.envvars import NOTIFY as NOTIFY_ENV
from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
from tests.support.plans import pinned_debug_cpu

SECRET_URL = "https://hooks.slack.com/services/T0/B0/SECRET-TOKEN-XYZ"


def with_notify(tmp_path: Path, notify: dict, **sections: dict) -> Path:
    path = pinned_debug_cpu(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["notify"] = notify
    for name, values in sections.items():
        data[name] = data.get(name, {}) | values
    path.write_text(yaml.safe_dump(data))
    return path


def test_mail_becomes_slurms_own_options(tmp_path: Path) -> None:
    script = plan_job(load_config(with_notify(tmp_path, {"mail": {
        "user": "ops@example.com", "events": ["completed", "requeued", "failed"]}}))).script()
    assert "#SBATCH --mail-type=REQUEUE,FAIL,END\n" in script
    assert "#SBATCH --mail-user=ops@example.com\n" in script


def test_mail_without_user_goes_to_the_submitting_user(tmp_path: Path) -> None:
    script = plan_job(load_config(with_notify(tmp_path, {"mail": {"events": ["failed"]}}))).script()
    assert "#SBATCH --mail-type=FAIL\n" in script
    assert "--mail-user" not in script


def test_no_notify_section_no_mail_no_export(tmp_path: Path) -> None:
    plan = plan_job(load_config(pinned_debug_cpu(tmp_path)))
    assert "--mail-" not in plan.script() and NOTIFY_ENV not in plan.script()


def test_webhooks_reach_the_batch_shell_by_variable_name_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", SECRET_URL)
    config = load_config(with_notify(tmp_path, {"webhooks": [
        {"format": "slack", "url_env": "SLACK_WEBHOOK_URL", "events": ["failed", "restart loop"]}]}))
    plan = plan_job(config)
    text = str(plan)
    export = next(line for line in plan.script().splitlines() if line.startswith(f"export {NOTIFY_ENV}="))
    assert "SLACK_WEBHOOK_URL" in export and '"restart loop"' in export
    assert "SECRET-TOKEN-XYZ" not in text and "hooks.slack.com" not in text
    assert "SECRET-TOKEN-XYZ" not in repr(config) + repr(plan)
    out, err = capsys.readouterr()
    assert "SECRET-TOKEN-XYZ" not in out + err and err == ""


def test_unset_variable_is_one_warning_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FEISHU_URL", raising=False)
    path = with_notify(tmp_path, {"webhooks": [{"format": "feishu", "url_env": "FEISHU_URL"}]})
    plan_job(load_config(path))
    err = capsys.readouterr().err
    assert err == (f"slurm-titan: WARNING: {path}: notify.webhooks[0].url_env: $FEISHU_URL is not set here; the "
                   "feishu webhook gets its URL only if the job's environment on the nodes sets it\n")


def test_an_export_that_drops_the_variable_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOOK", SECRET_URL)
    path = with_notify(tmp_path, {"webhooks": [{"format": "json", "url_env": "HOOK"}]},
                       slurm={"extra": {"export": "NONE"}})
    plan_job(load_config(path))
    err = capsys.readouterr().err
    assert err.rstrip().endswith("notify.webhooks[0].url_env: slurm.extra.export='NONE' does not pass $HOOK on "
                                 "to the job")
    assert "SECRET-TOKEN-XYZ" not in err
    for export in ("ALL", "ALL,FOO=1", "HOOK,PATH"):
        plan_job(load_config(with_notify(tmp_path, {"webhooks": [{"format": "json", "url_env": "HOOK"}]},
                                         slurm={"extra": {"export": export}})))
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("notify", "env", "message"), [
    ({"webhooks": [{"format": "teams", "url_env": "X"}]}, {},
     "notify.webhooks[0].format: must be one of 'json' | 'slack' | 'feishu' | 'dingtalk', got 'teams'"),
    ({"webhooks": [{"url_env": "X"}]}, {}, "notify.webhooks[0].format: is required"),
    ({"webhooks": [{"format": "slack", "url_env": "X", "events": ["failed", "restart_loop"]}]}, {},
     "notify.webhooks[0].events[1]: unknown event 'restart_loop' (did you mean 'restart loop'?)"),
    ({"mail": {"events": ["restart loop"]}}, {},
     "notify.mail.events[0]: unknown event 'restart loop'; Slurm mails only for requeued, failed, completed"),
    ({"mail": {"user": "ops@example.com"}}, {}, "notify.mail.user: is set but notify.mail.events is empty"),
    ({"mail": {"user": "ops@example.com\n#SBATCH --x", "events": ["failed"]}}, {}, "notify.mail.user: "),
    ({"timeout_s": 0}, {}, "notify.timeout_s: must be 1..60 s, got 0"),
    ({"webhooks": [{"format": "slack", "url": "X"}]}, {}, "notify.webhooks[0].url: unknown key (did you mean"),
    ({"webhooks": [{"format": "slack", "url_env": "SLACK_URL"}]}, {"SLACK_URL": SECRET_URL},
     "environment.env.SLACK_URL: holds the URL of notify.webhooks[0] and would be written into the sbatch script"),
])
def test_bad_notify_is_a_config_error_naming_the_key(tmp_path: Path, notify: dict, env: dict, message: str) -> None:
    path = with_notify(tmp_path, notify, environment={"env": env})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)


def test_a_url_given_as_the_variable_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = with_notify(tmp_path, {"webhooks": [{"format": "slack", "url_env": SECRET_URL}]})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: notify.webhooks[0].url_env: must name the environment variable")
    assert "SECRET-TOKEN-XYZ" not in str(caught.value)
