"""The equivalence checks pass, report as a table, and catch a broken translation."""

import slurm_titan.overrides.npu_attention as npu_attention
from slurm_titan.overrides.check import main, run_checks


def test_all_checks_pass():
    results = run_checks(seed=0)
    failed = [r for r in results if not r.ok]
    assert not failed, failed
    checks = {r.check for r in results}
    assert {
        "rope.reference fwd",
        "rope.reference bwd",
        "rope.npu_model bwd",
        "attention.reference_vs_flex fwd",
        "attention.reference_vs_math bwd",
        "attention.npu_model fwd",
        "attention.npu_model bwd",
        "rmsnorm.npu_model bwd",
    } <= checks
    assert {r.dtype for r in results} == {"float32", "bfloat16"}
    assert all(r.tolerance == 0 for r in results if r.check.startswith("rope.reference"))


def test_main_prints_table(capsys):
    assert main(["--quick", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["check", "dtype", "shape", "max", "error", "tolerance", "ok"]
    assert "checks passed" in out


def test_a_wrong_scale_fails_only_the_npu_attention_check(monkeypatch):
    translate = npu_attention.fusion_attention_kwargs
    monkeypatch.setattr(npu_attention, "fusion_attention_kwargs", lambda **kw: translate(**kw) | {"scale": 1.0})
    failed = {r.check for r in run_checks(seed=1, quick=True) if not r.ok}
    assert failed == {"attention.npu_model fwd", "attention.npu_model bwd"}
