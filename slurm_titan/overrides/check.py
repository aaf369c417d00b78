"""Equivalence checks for the NPU overrides (``slurm-titan check-overrides [--device npu]``).

Over random packed-document batches plus fixed wide ones (GQA, up to 8
documents per row, head dim 128), forward and backward:

* ``rope.tables``: the NPU RoPE path's cos/sin tables, read from a real view
  of the cache, equal upstream ``ComplexRoPE``'s complex cache lookup bit for bit.
* ``rope.<kernels>``: the NPU RoPE path (``interleave`` mode, the batch folded
  into the sequence) against upstream ``ComplexRoPE``.
* ``attention.reference_vs_flex`` (CPU only): the attention override off NPU
  against upstream FlexAttention with torchtitan's own block-causal document
  mask (eager, forward only: FlexAttention has no CPU backward).
* ``attention.reference_vs_math`` (CPU only): the same against fp64 math
  attention under that mask, forward and backward.
* ``attention.<kernels>``: the attention NPU path against the reference path.
* ``rmsnorm.<kernels>``: the RMSNorm NPU path against upstream ``RMSNorm``.
* ``<family>.npu_contract`` (CPU only): the NPU paths of :data:`LLAMA3_CASES`
  (the shapes the NPU configs train: llama3 8B and 70B heads, head dim 128,
  8192 tokens) on meta tensors with the contract models, in bf16, forward and
  backward: every shape the kernels get is checked against their documented
  limits, at no cost, so a configuration the hardware cannot run fails here.

``<kernels>`` is ``npu_model`` on CPU: the NPU paths run on the contract models
of :mod:`.kernel_models`, under :class:`.npu_capabilities.RefuseAscendUnsupported`
(so an op Ascend lacks fails the check), in fp32 and bf16. With ``--device
npu`` it is ``npu_kernel``: the NPU paths run torch_npu's kernels on NPU
tensors in bf16 (plus a case with a document longer than the 2048-token
compressed mask, and :data:`LLAMA3_CASES`), against the same references computed on the CPU; the RoPE
cache is copied to the device, not recomputed there. The error of a result
against an expectation is ``max|a - b| / max(1, max|b|)``.

``python -m slurm_titan.overrides.check`` is the preflight doctor's child process
(``doctor.check_kernels``): the quick device checks, one verdict line each; exit 0
when they ran (the doctor judges the verdicts), 2 without an NPU.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch.func import functional_call
from torch.nn.attention.flex_attention import (
    _mask_mod_signature,
    and_masks,
    create_block_mask,
    create_mask,
    flex_attention,
)
from torchtitan.models.common.attention import (
    FlexAttention,
    create_varlen_metadata_for_document,
    get_causal_mask_mod,
    get_efficient_causal_mask_mod_for_packed_document,
)
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.models.common.rope import ComplexRoPE

from slurm_titan import table
from slurm_titan.overrides.kernel_models import MODEL_KERNELS
from slurm_titan.overrides.kernels import NpuKernels, torch_npu_kernels
from slurm_titan.overrides.npu_attention import npu_fused_attention
from slurm_titan.overrides.npu_capabilities import RefuseAscendUnsupported
from slurm_titan.overrides.npu_norm import npu_rms_norm
from slurm_titan.overrides.npu_rope import npu_rotary_rope, rotation_angles

DTYPES = (torch.float32, torch.bfloat16)
DEVICE_DTYPES = (torch.bfloat16,)
"""The device run checks the training dtype."""
TOLERANCES = {
    torch.float32: {"fwd": 5e-6, "bwd": 5e-6},
    torch.bfloat16: {"fwd": 2e-2, "bwd": 4e-2},
}
"""Relative error bounds per dtype; ``rope.tables`` must match exactly."""


@dataclass(frozen=True)
class CheckResult:
    """One compared quantity: ``max_error`` must not exceed ``tolerance``."""

    check: str
    dtype: str
    shape: str
    max_error: float
    tolerance: float
    raised: str = ""
    """The first line of the exception the checked code raised (then ``max_error`` is inf)."""

    @property
    def ok(self) -> bool:
        return math.isfinite(self.max_error) and self.max_error <= self.tolerance


@dataclass(frozen=True)
class Target:
    """Where the checks run the NPU code paths: a device for their tensors and the kernels they call."""

    name: str
    """Names the checks: ``rope.<name>``, ..."""
    device: torch.device
    kernels: NpuKernels
    refuse_unsupported: bool
    """Run the NPU paths under :class:`RefuseAscendUnsupported` (a CPU stand-in for the device's gaps)."""

    def context(self) -> AbstractContextManager[object]:
        return RefuseAscendUnsupported() if self.refuse_unsupported else nullcontext()


CPU_MODELS = Target("npu_model", torch.device("cpu"), MODEL_KERNELS, refuse_unsupported=True)
"""The NPU paths on CPU, with the contract models, refusing what Ascend lacks."""
CONTRACT = Target("npu_contract", torch.device("meta"), MODEL_KERNELS, refuse_unsupported=True)
"""The NPU paths on meta tensors with the contract models: shapes, dtypes and layouts checked, no maths."""


class DeviceUnavailable(Exception):
    """No NPU to check on; the message is one line."""


def npu_target() -> Target:
    """torch_npu's kernels on the current NPU, or :class:`DeviceUnavailable` saying why not."""
    try:
        kernels = torch_npu_kernels()  # imports torch_npu, which adds torch.npu
    except ImportError as exc:
        if exc.name == "torch_npu":
            raise DeviceUnavailable("torch_npu is not installed") from None
        raise DeviceUnavailable(f"torch_npu does not import: {_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001  a native extension's import (CANN not sourced, ...) can raise anything
        raise DeviceUnavailable(f"torch_npu does not import: {_first_line(exc)}") from None
    if not torch.npu.is_available() or torch.npu.device_count() == 0:  # type: ignore[attr-defined]  # torch_npu's
        raise DeviceUnavailable("torch_npu sees 0 NPUs")
    return Target("npu_kernel", torch.device("npu"), kernels, refuse_unsupported=False)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True)
class _Case:
    """A packed batch: per row, the lengths of its documents; plus the attention head layout."""

    doc_lengths: tuple[tuple[int, ...], ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dim: int | None = None
    """The model dim RMSNorm normalises (None: ``n_heads * head_dim``; tensor parallelism shards the heads only)."""

    @property
    def norm_dim(self) -> int:
        return self.dim or self.n_heads * self.head_dim

    @property
    def batch(self) -> int:
        return len(self.doc_lengths)

    @property
    def seq_len(self) -> int:
        return sum(self.doc_lengths[0])

    @property
    def label(self) -> str:
        docs = "/".join(str(len(row)) for row in self.doc_lengths)
        return f"B{self.batch} L{self.seq_len} heads {self.n_heads}/{self.n_kv_heads} D{self.head_dim} docs {docs}"

    def positions(self) -> torch.Tensor:
        """Per-document positions as torchtitan's dataloader emits them (reset to 0 per document)."""
        return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in self.doc_lengths])


WIDE_CASES = (
    _Case(((90, 3, 17, 40, 1, 33, 72),), n_heads=8, n_kv_heads=2, head_dim=128),
    _Case(((20, 20, 20, 20, 20, 20, 8), (64, 32, 16, 8, 4, 2, 1, 1)), n_heads=4, n_kv_heads=1, head_dim=128),
)
"""Fixed cases with llama3's head dim, GQA and more documents per row than the random ones."""

LONG_CASE = _Case(((2100, 150, 54),), n_heads=2, n_kv_heads=1, head_dim=128)
"""A document longer than the 2048x2048 compressed causal mask (device runs only: dense CPU maths is slow)."""

_PACKED_8K = ((3000, 1200, 2500, 800, 692), (512,) * 16)
"""Two rows of 8192 tokens (seq_len of the NPU configs): a few long documents, and many short ones."""
LLAMA3_CASES = (
    _Case(_PACKED_8K[:1], n_heads=32, n_kv_heads=8, head_dim=128),
    _Case(_PACKED_8K, n_heads=8, n_kv_heads=1, head_dim=128, dim=8192),
    _Case(_PACKED_8K, n_heads=64, n_kv_heads=8, head_dim=128),
)
"""What the NPU configs train, from torchtitan 0.3.0's llama3 configs (models/llama3/__init__.py): llama3_8b
(dim 4096, 32 query and 8 key/value heads, head dim 128) at local batch 1 (configs/llama3_8b_npu*.yaml, FSDP);
llama3_70b (dim 8192, 64/8 heads, head dim 128) at local batch 2, per rank of configs/llama3_70b_npu.yaml's
tensor parallel 8 (8/1 heads) and whole. Too large for CPU maths: checked on meta tensors here (CONTRACT),
on the real kernels with ``--device npu``."""


def _random_case(gen: torch.Generator) -> _Case:
    def pick(options: Sequence[int]) -> int:
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    batch, seq_len = pick([1, 2, 3]), pick([48, 64, 96, 130, 160])
    n_kv_heads, group, head_dim = pick([1, 2, 4]), pick([1, 2, 4]), pick([8, 16, 32])
    rows = []
    for _ in range(batch):
        n_docs = pick([2, 3, 4, 5])
        cuts = sorted(torch.randperm(seq_len - 1, generator=gen)[: n_docs - 1].add(1).tolist())
        bounds = [0, *cuts, seq_len]
        rows.append(tuple(b - a for a, b in pairwise(bounds)))
    return _Case(tuple(rows), n_kv_heads * group, n_kv_heads, head_dim)


def _error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    scale = max(1.0, expected.abs().max().item())
    return (actual.double() - expected).abs().max().item() / scale


Outputs = tuple[torch.Tensor, list[torch.Tensor]]
"""A result and the gradients of the inputs (empty: forward only), on the CPU."""


def _fwd_bwd(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None,
    target: Target | None = None,
    to_cpu: bool = True,
) -> Outputs:
    """``fn(*inputs)`` and, given ``grad_out``, the gradients of every input (copied to the CPU unless not
    ``to_cpu``: meta tensors have no data to copy).

    With a ``target``, the inputs are moved to its device and ``fn`` runs (forward
    and backward) in its context; without one, on the CPU as given.
    """
    device = target.device if target else inputs[0].device
    leaves = [x.detach().to(device).clone().requires_grad_(grad_out is not None) for x in inputs]
    with target.context() if target else nullcontext():
        out = fn(*leaves)
        grads = [] if grad_out is None else torch.autograd.grad(out, leaves, grad_out.to(device, out.dtype))
    if not to_cpu:
        return out.detach(), list(grads)
    return out.detach().cpu(), [g.cpu() for g in grads]


class _Recorder:
    """Collects forward and backward rows for one case and dtype."""

    def __init__(self, case: _Case, dtype: torch.dtype) -> None:
        self.case, self.dtype = case, dtype
        self.results: list[CheckResult] = []

    def compare(self, check: str, actual: Outputs, expected: Outputs, *, exact: bool = False) -> None:
        tolerances = TOLERANCES[self.dtype]
        self._add(f"{check} fwd", _error(actual[0], expected[0]), 0.0 if exact else tolerances["fwd"])
        if expected[1]:
            errors = [_error(a, e) for a, e in zip(actual[1], expected[1], strict=True)]
            self._add(f"{check} bwd", max(errors), 0.0 if exact else tolerances["bwd"])

    def raised(self, check: str, exc: Exception) -> None:
        self._add(check, math.inf, 0.0, f"{type(exc).__name__}: {_first_line(exc)}")

    def ran(self, check: str) -> None:
        """A check that only has to run (no result to compare)."""
        self._add(check, 0.0, 0.0)

    def _add(self, check: str, error: float, tolerance: float, raised: str = "") -> None:
        dtype = str(self.dtype).removeprefix("torch.")
        self.results.append(CheckResult(check, dtype, self.case.label, error, tolerance, raised))


def _rope_checks(rec: _Recorder, gen: torch.Generator, target: Target) -> None:
    case, dtype = rec.case, rec.dtype
    cfg = ComplexRoPE.Config(dim=case.head_dim, max_seq_len=case.seq_len, theta=500000, scaling="llama")
    upstream, override = cfg.build(), npu_rotary_rope(cfg).build().to(target.device)
    positions = case.positions()
    q = torch.randn(case.batch, case.seq_len, case.n_heads, case.head_dim, generator=gen).to(dtype)
    k = torch.randn(case.batch, case.seq_len, case.n_kv_heads, case.head_dim, generator=gen).to(dtype)
    grad = torch.randn(q.numel() + k.numel(), generator=gen)

    with target.context():
        tables = torch.stack(rotation_angles(override.cache, positions.to(target.device), case.seq_len)).cpu()
    cache = upstream._reshape_cache(q, positions)
    rec.compare("rope.tables", (tables, []), (torch.stack([cache.real, cache.imag]), []), exact=True)

    def flat(rope: Callable[..., tuple[torch.Tensor, torch.Tensor]], rope_positions: torch.Tensor,
             **kwargs: object) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda q, k: torch.cat([t.flatten() for t in rope(q, k, rope_positions, **kwargs)])

    expected = _fwd_bwd(flat(upstream, positions), (q, k), grad)
    npu_path = flat(override, positions.to(target.device), kernels=target.kernels)
    rec.compare(f"rope.{target.name}", _fwd_bwd(npu_path, (q, k), grad, target), expected)


def _document_mask_mod(positions: torch.Tensor) -> _mask_mod_signature:
    """torchtitan's block-causal mask for packed documents (as its Decoder builds it)."""
    return and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))


def _math_attention(allowed: torch.Tensor, scale: float) -> Callable[..., torch.Tensor]:
    """Dense attention in the inputs' dtype: ``allowed`` is ``(B, 1, L, L)``, True = attend."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        group = q.shape[2] // k.shape[2]
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
        return (scores.softmax(dim=-1) @ v).transpose(1, 2)

    return fn


def _flex_attention(positions: torch.Tensor) -> Callable[..., torch.Tensor]:
    batch, seq_len = positions.shape
    block_mask = create_block_mask(_document_mask_mod(positions), batch, None, seq_len, seq_len, device="cpu")

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # eager flex warns that it is unfused; fine for a check
            warnings.simplefilter("ignore")
            query, key, value = (x.transpose(1, 2) for x in (q, k, v))
            out = flex_attention(
                query, key, value,
                block_mask=block_mask,
                enable_gqa=q.shape[2] != k.shape[2],
            )
        assert isinstance(out, torch.Tensor)
        return out.transpose(1, 2)

    return fn


def _attention_checks(rec: _Recorder, gen: torch.Generator, target: Target, *, upstream: bool) -> None:
    case, dtype = rec.case, rec.dtype
    positions = case.positions()
    attention = npu_fused_attention(FlexAttention.Config()).build()

    def override(metadata_positions: torch.Tensor, **kwargs: object) -> Callable[..., torch.Tensor]:
        metadata = create_varlen_metadata_for_document(metadata_positions)
        return lambda q, k, v: attention(q, k, v, attention_masks=metadata, **kwargs)

    shape_q = (case.batch, case.seq_len, case.n_heads, case.head_dim)
    shape_kv = (case.batch, case.seq_len, case.n_kv_heads, case.head_dim)
    q, k, v = (torch.randn(s, generator=gen).to(dtype) for s in (shape_q, shape_kv, shape_kv))
    grad = torch.randn(shape_q, generator=gen)

    reference = _fwd_bwd(override(positions), (q, k, v), grad)
    if upstream:
        flex = _fwd_bwd(_flex_attention(positions), (q, k, v), None)
        rec.compare("attention.reference_vs_flex", (reference[0], []), flex)
        allowed = create_mask(_document_mask_mod(positions), case.batch, None, case.seq_len, case.seq_len, device="cpu")
        math_fp64 = _fwd_bwd(_math_attention(allowed, case.head_dim**-0.5), [x.double() for x in (q, k, v)], grad)
        rec.compare("attention.reference_vs_math", reference, math_fp64)
    npu_path = override(positions.to(target.device), kernels=target.kernels)
    rec.compare(f"attention.{target.name}", _fwd_bwd(npu_path, (q, k, v), grad, target), reference)


def _rms_norm_checks(rec: _Recorder, gen: torch.Generator, target: Target) -> None:
    case, dtype = rec.case, rec.dtype
    dim = case.norm_dim
    cfg = RMSNorm.Config(normalized_shape=dim)
    upstream, override = cfg.build(), npu_rms_norm(cfg).build().to(target.device)  # weights via functional_call
    x = torch.randn(case.batch, case.seq_len, dim, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    grad = torch.randn(x.shape, generator=gen)

    def run(norm: torch.nn.Module, **kwargs: object) -> Callable[..., torch.Tensor]:
        return lambda x, w: functional_call(norm, {"weight": w}, (x,), kwargs)

    npu_path = _fwd_bwd(run(override, kernels=target.kernels), (x, weight), grad, target)
    rec.compare(f"rmsnorm.{target.name}", npu_path, _fwd_bwd(run(upstream), (x, weight), grad))


def _run(
    cases: Sequence[_Case],
    dtypes: Sequence[torch.dtype],
    gen: torch.Generator,
    target: Target,
    *,
    upstream: bool,
) -> list[CheckResult]:
    """Every case in every dtype; a check family that raises is one failed row, and the others still run."""
    families: dict[str, Callable[[_Recorder], None]] = {
        "rope": lambda rec: _rope_checks(rec, gen, target),
        "attention": lambda rec: _attention_checks(rec, gen, target, upstream=upstream),
        "rmsnorm": lambda rec: _rms_norm_checks(rec, gen, target),
    }
    results: list[CheckResult] = []
    for case in cases:
        for dtype in dtypes:
            rec = _Recorder(case, dtype)
            for family, check in families.items():
                try:
                    check(rec)
                except Exception as exc:  # noqa: BLE001  a kernel or a refused op: report it, check the rest
                    rec.raised(f"{family}.{target.name} raised", exc)
            results.extend(rec.results)
    return results


def _random_cases(gen: torch.Generator, quick: bool) -> list[_Case]:
    return [_random_case(gen) for _ in range(2 if quick else 6)]


def _contract_paths(case: _Case) -> dict[str, tuple[Callable[..., torch.Tensor], list[torch.Tensor], torch.Tensor]]:
    """Each family's NPU path on :data:`CONTRACT` with its bf16 meta inputs and output gradient."""
    positions = case.positions()
    rope = npu_rotary_rope(ComplexRoPE.Config(dim=case.head_dim, max_seq_len=case.seq_len, theta=500000,
                                              scaling="llama")).build().to(CONTRACT.device)
    attention = npu_fused_attention(FlexAttention.Config()).build()
    metadata = create_varlen_metadata_for_document(positions)  # on the CPU: its host offsets are read
    norm = npu_rms_norm(RMSNorm.Config(normalized_shape=case.norm_dim)).build().to(CONTRACT.device)

    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.bfloat16, device=CONTRACT.device)

    q, k, v = (meta(case.batch, case.seq_len, heads, case.head_dim)
               for heads in (case.n_heads, case.n_kv_heads, case.n_kv_heads))
    x = meta(case.batch, case.seq_len, case.norm_dim)
    meta_positions, kernels = positions.to(CONTRACT.device), CONTRACT.kernels
    return {
        "rope": (lambda q, k: torch.cat([t.flatten() for t in rope(q, k, meta_positions, kernels=kernels)]),
                 [q, k], meta(q.numel() + k.numel())),
        "attention": (lambda q, k, v: attention(q, k, v, attention_masks=metadata, kernels=kernels),
                      [q, k, v], meta(*q.shape)),
        "rmsnorm": (lambda x, w: functional_call(norm, {"weight": w}, (x,), {"kernels": kernels}),
                    [x, meta(case.norm_dim)], meta(*x.shape)),
    }


def run_contract_checks(cases: Sequence[_Case] = LLAMA3_CASES) -> list[CheckResult]:
    """The NPU paths of ``cases`` forward and backward on meta tensors (:data:`CONTRACT`), in bf16: one row
    per family and case, failed with what raised when a kernel's contract refuses a shape."""
    results = []
    for case in cases:
        rec = _Recorder(case, torch.bfloat16)
        for family, (fn, inputs, grad) in _contract_paths(case).items():
            try:
                _fwd_bwd(fn, inputs, grad, CONTRACT, to_cpu=False)
                rec.ran(f"{family}.{CONTRACT.name}")
            except Exception as exc:  # noqa: BLE001  a refused shape: report it, check the rest
                rec.raised(f"{family}.{CONTRACT.name}", exc)
        results.extend(rec.results)
    return results


def run_checks(seed: int = 0, quick: bool = False) -> list[CheckResult]:
    """The CPU checks: random cases (2 when ``quick``, else 6) and :data:`WIDE_CASES`, fp32 and bf16, and the
    contract of :data:`LLAMA3_CASES`."""
    gen = torch.Generator().manual_seed(seed)
    cases = [*_random_cases(gen, quick), *WIDE_CASES]
    return _run(cases, DTYPES, gen, CPU_MODELS, upstream=True) + run_contract_checks()


def run_device_checks(target: Target, seed: int = 0, quick: bool = False) -> list[CheckResult]:
    """The NPU-path checks on ``target``: the CPU run's cases plus :data:`LONG_CASE` and :data:`LLAMA3_CASES`,
    in bf16."""
    gen = torch.Generator().manual_seed(seed)
    cases = [*_random_cases(gen, quick), *WIDE_CASES, LONG_CASE, *LLAMA3_CASES]
    return _run(cases, DEVICE_DTYPES, gen, target, upstream=False)


def format_table(results: Sequence[CheckResult]) -> str:
    """The results as an aligned text table."""
    return table.render(("check", "dtype", "shape", "max error", "tolerance", "ok"), [
        (r.check, r.dtype, r.shape, f"{r.max_error:.3g}", f"{r.tolerance:.3g}", "ok" if r.ok else f"FAIL {r.raised}")
        for r in results
    ])


def format_verdicts(results: Sequence[CheckResult]) -> str:
    """One line per check and dtype: ``ok``/``FAIL``, its worst error and the case it came from."""
    groups: dict[tuple[str, str], list[CheckResult]] = defaultdict(list)
    for r in results:
        groups[r.check, r.dtype].append(r)
    lines = []
    for (check, dtype), group in groups.items():
        worst = max(group, key=lambda r: (not r.ok, r.max_error))
        verdict = "ok" if all(r.ok for r in group) else "FAIL"
        detail = worst.raised or f"max error {worst.max_error:.3g} (tolerance {worst.tolerance:.3g})"
        lines.append(f"{verdict:4} {check} {dtype}: {detail} in {worst.shape}, {len(group)} cases")
    return "\n".join(lines)


def _device_target() -> Target | None:
    """:func:`npu_target`, or None after one line on stderr saying why there is none."""
    try:
        return npu_target()
    except DeviceUnavailable as exc:
        print(f"check-overrides --device npu: {exc}", file=sys.stderr)
        return None


def run(device: str = "cpu", seed: int = 0, quick: bool = False) -> int:
    """Print the check table and one verdict per check; 0 when every check passes, 2 without a device, else 1."""
    if device == "npu":
        if (target := _device_target()) is None:
            return 2
        results = run_device_checks(target, seed=seed, quick=quick)
    else:
        results = run_checks(seed=seed, quick=quick)
    print(format_table(results))
    print(format_verdicts(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0


def preflight_verdicts() -> int:
    """The doctor's kernel check: the quick device checks' verdicts; 0 when they ran, 2 without an NPU."""
    if (target := _device_target()) is None:
        return 2
    print(format_verdicts(run_device_checks(target, quick=True)))
    return 0


if __name__ == "__main__":
    sys.exit(preflight_verdicts())
