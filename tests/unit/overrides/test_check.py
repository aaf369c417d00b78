"""The equivalence checks pass, report as a table and verdicts, catch a broken translation, and run on a device."""

import sys
import types

import pytest
import torch

import slurm_titan.overrides.check as check
import slurm_titan.overrides.npu_attention as npu_attention
from slurm_titan.cli.main import main as cli_main
from slurm_titan.launch.config import load_config
from slurm_titan.overrides.check import LLAMA3_CASES, Target, run, run_checks, run_contract_checks, run_device_checks
from slurm_titan.overrides.kernel_models import MODEL_KERNELS
from slurm_titan.overrides.kernels import NpuKernels, torch_npu_kernels
from slurm_titan.overrides.npu_rope import NpuComplexRoPE, rotary_npu
from tests.support.paths import REPO


def test_all_checks_pass():
    results = run_checks(seed=0)
    failed = [r for r in results if not r.ok]
    assert not failed, failed
    checks = {r.check for r in results}
    assert {
        "rope.tables fwd",
        "rope.npu_model fwd",
        "rope.npu_model bwd",
        "attention.reference_vs_flex fwd",
        "attention.reference_vs_math bwd",
        "attention.npu_model fwd",
        "attention.npu_model bwd",
        "rmsnorm.npu_model bwd",
        "rope.npu_contract",
        "attention.npu_contract",
        "rmsnorm.npu_contract",
    } <= checks
    assert {r.dtype for r in results} == {"float32", "bfloat16"}
    assert all(r.tolerance == 0 for r in results if r.check.startswith("rope.tables"))
    shapes = {r.shape for r in results}
    assert any("D128" in s and "docs 7/8" in s for s in shapes)  # head dim 128, more than 5 docs per row
    assert any(s.startswith("B1 ") for s in shapes) and any(not s.startswith("B1 ") for s in shapes)
    assert {"B1 L8192 heads 32/8 D128 docs 5", "B2 L8192 heads 8/1 D128 docs 5/16",
            "B2 L8192 heads 64/8 D128 docs 5/16"} <= shapes  # llama3 8B and 70B as the NPU configs train them


def test_the_model_cases_are_the_configs_shapes():
    from torchtitan.models.llama3 import llama3_configs

    def shape(flavor: str, tp: int) -> tuple[int, int, int, int]:
        model = llama3_configs[flavor]("flex")
        attention = model.layers[0].attention
        return attention.n_heads // tp, attention.n_kv_heads // tp, attention.rope.dim, model.dim

    args = {name: load_config(REPO / f"configs/{name}.yaml").torchtitan.args for name in ("llama3_8b_npu",
                                                                                        "llama3_70b_npu")}
    tp = args["llama3_70b_npu"]["parallelism"]["tensor_parallel_degree"]
    expected = [(1, shape("8B", 1)), (2, shape("70B", tp)), (2, shape("70B", 1))]
    assert [(case.batch, (case.n_heads, case.n_kv_heads, case.head_dim, case.norm_dim)) for case in LLAMA3_CASES] == \
        expected
    assert {case.seq_len for case in LLAMA3_CASES} == {a["training"]["seq_len"] for a in args.values()} == {8192}
    assert [a["training"]["local_batch_size"] for a in args.values()] == [1, 2]


def test_a_shape_the_kernels_cannot_take_is_refused_on_the_cpu():
    too_many_heads = check._Case(((8192,),), n_heads=512, n_kv_heads=8, head_dim=128)
    too_wide = check._Case(((4096, 4096),), n_heads=8, n_kv_heads=8, head_dim=1024)
    rows = {(r.shape.split(" D")[0], r.check): r for r in run_contract_checks([too_many_heads, too_wide])}
    refused = {key: r.raised for key, r in rows.items() if not r.ok}
    assert refused == {
        ("B1 L8192 heads 512/8", "attention.npu_contract"):
            "ValueError: head_num=512 with 512 query and 8 key/value heads (at most 256)",
        ("B1 L8192 heads 8/8", "attention.npu_contract"): "ValueError: head dim 1024 exceeds 768",
        ("B1 L8192 heads 8/8", "rope.npu_contract"): "ValueError: head dim must be even and < 896, got 1024",
    }


def test_main_prints_table_and_one_verdict_per_check(capsys):
    assert run(seed=3, quick=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["check", "dtype", "shape", "max", "error", "tolerance", "ok"]
    verdicts = [line for line in lines if line.startswith("ok   ")]
    assert len(verdicts) == len({tuple(v.split(":")[0].split()[1:]) for v in verdicts}) == 2 * 10 + 3
    assert lines[-1].endswith("checks passed")


def test_a_wrong_scale_fails_only_the_npu_attention_check(monkeypatch):
    translate = npu_attention.fusion_attention_kwargs
    monkeypatch.setattr(npu_attention, "fusion_attention_kwargs", lambda **kw: translate(**kw) | {"scale": 1.0})
    failed = {r.check for r in run_checks(seed=1, quick=True) if not r.ok}
    assert failed == {"attention.npu_model fwd", "attention.npu_model bwd"}


def test_the_old_complex_cache_lookup_fails_the_cpu_check(monkeypatch):
    def old_forward(self, query, key, positions=None, *, kernels=None):
        cache = self._reshape_cache(query, positions)  # upstream's complex64 index/gather, as before the fix
        return rotary_npu(query, key, cache.real, cache.imag, kernels)

    monkeypatch.setattr(NpuComplexRoPE, "forward", old_forward)
    results = run_checks(seed=0, quick=True)
    failed = [r for r in results if not r.ok]
    assert {r.check for r in failed} == {"rope.npu_model raised", "rope.npu_contract"}  # the contract run too
    assert {r.shape.split()[0] for r in failed} >= {"B1", "B2"}  # index at batch 1, gather above
    assert all("AscendUnsupportedError" in r.raised and "complex64" in r.raised for r in failed)


def test_device_checks_run_through_the_device_plumbing(monkeypatch):
    monkeypatch.setattr(check, "LLAMA3_CASES", ())  # model-sized: too slow for CPU maths
    devices = set()

    def on(kernel):
        def call(*args, **kwargs):
            devices.update(a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            return kernel(*args, **kwargs)

        return call

    names = ("npu_fusion_attention", "npu_rotary_mul", "npu_rms_norm")
    kernels = NpuKernels(*(on(getattr(MODEL_KERNELS, name)) for name in names))
    target = Target("npu_kernel", torch.device("cpu"), kernels, refuse_unsupported=False)
    results = run_device_checks(target, seed=2, quick=True)
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert devices == {torch.device("cpu")}
    assert {r.dtype for r in results} == {"bfloat16"}
    assert {r.check for r in results} == {
        f"{family}.npu_kernel {way}" for family in ("rope", "attention", "rmsnorm") for way in ("fwd", "bwd")
    } | {"rope.tables fwd"}
    assert any("L2304" in r.shape for r in results)  # a document longer than the 2048 compressed mask


def test_device_checks_run_the_model_cases(monkeypatch):
    ran = []
    monkeypatch.setattr(check, "_run", lambda cases, *args, **kwargs: ran.extend(cases) or [])
    run_device_checks(check.CPU_MODELS, quick=True)
    assert set(LLAMA3_CASES) <= set(ran)


def test_device_npu_without_torch_npu_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ImportError(name="torch_npu")
    torch_npu_kernels.cache_clear()
    assert cli_main(["check-overrides", "--device", "npu"]) == 2
    out = capsys.readouterr()
    assert out.err == "check-overrides --device npu: torch_npu is not installed\n" and out.out == ""


@pytest.mark.parametrize(
    "npu, message",
    [
        (types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0), "torch_npu sees 0 NPUs"),
        (None, "torch_npu does not import: libhccl.so: cannot open shared object file"),
    ],
)
def test_device_npu_without_npus_is_one_line(monkeypatch, capsys, npu, message):
    fake = types.ModuleType("torch_npu")
    fake.npu_fusion_attention = fake.npu_rotary_mul = fake.npu_rms_norm = None
    if npu is None:
        error = OSError(message.split(": ", 1)[1] + "\n(more lines)")
        monkeypatch.setattr(check, "torch_npu_kernels", lambda: (_ for _ in ()).throw(error))
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    torch_npu_kernels.cache_clear()
    assert run("npu") == 2
    assert capsys.readouterr().err == f"check-overrides --device npu: {message}\n"
    torch_npu_kernels.cache_clear()
