"""CPU equivalence checks for the NPU overrides (``slurm-titan check-overrides``).

Over random packed-document batches (GQA, several documents per row, fp32
and bf16, forward and backward):

* ``rope.reference``: the RoPE override off NPU is upstream ``ComplexRoPE``, bit for bit.
* ``rope.npu_model``: its NPU path, run on the ``npu_rotary_mul`` contract model.
* ``attention.reference_vs_flex``: the attention override off NPU against
  upstream FlexAttention with torchtitan's own block-causal document mask
  (eager, forward only: FlexAttention has no CPU backward).
* ``attention.reference_vs_math``: the same against fp64 math attention under
  that mask, forward and backward.
* ``attention.npu_model``: the attention NPU path, run on the
  ``npu_fusion_attention`` contract model, against the reference path.
* ``rmsnorm.npu_model``: the RMSNorm NPU path on the ``npu_rms_norm`` model
  against upstream ``RMSNorm``.

The error of a result against an expectation is ``max|a - b| / max(1, max|b|)``.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable, Sequence
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

from .kernel_models import MODEL_KERNELS
from .npu_attention import npu_fused_attention
from .npu_norm import npu_rms_norm
from .npu_rope import npu_rotary_rope

DTYPES = (torch.float32, torch.bfloat16)
TOLERANCES = {
    torch.float32: {"fwd": 5e-6, "bwd": 5e-6},
    torch.bfloat16: {"fwd": 2e-2, "bwd": 4e-2},
}
"""Relative error bounds per dtype; ``rope.reference`` must match exactly."""


@dataclass(frozen=True)
class CheckResult:
    """One compared quantity: ``max_error`` must not exceed ``tolerance``."""

    check: str
    dtype: str
    shape: str
    max_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.max_error) and self.max_error <= self.tolerance


@dataclass(frozen=True)
class _Case:
    """A packed batch: per row, the lengths of its documents; plus the attention head layout."""

    doc_lengths: tuple[tuple[int, ...], ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int

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


def _fwd_bwd(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``fn(*inputs)`` and, given ``grad_out``, the gradients of every input."""
    leaves = [x.detach().clone().requires_grad_(grad_out is not None) for x in inputs]
    out = fn(*leaves)
    if grad_out is None:
        return out.detach(), []
    return out.detach(), list(torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))


class _Recorder:
    """Collects forward and backward rows for one case and dtype."""

    def __init__(self, case: _Case, dtype: torch.dtype) -> None:
        self.case, self.dtype = case, dtype
        self.results: list[CheckResult] = []

    def compare(
        self,
        check: str,
        actual: tuple[torch.Tensor, list[torch.Tensor]],
        expected: tuple[torch.Tensor, list[torch.Tensor]],
        *,
        exact: bool = False,
    ) -> None:
        tolerances = TOLERANCES[self.dtype]
        self._add(f"{check} fwd", _error(actual[0], expected[0]), 0.0 if exact else tolerances["fwd"])
        if expected[1]:
            errors = [_error(a, e) for a, e in zip(actual[1], expected[1], strict=True)]
            self._add(f"{check} bwd", max(errors), 0.0 if exact else tolerances["bwd"])

    def _add(self, check: str, error: float, tolerance: float) -> None:
        dtype = str(self.dtype).removeprefix("torch.")
        self.results.append(CheckResult(check, dtype, self.case.label, error, tolerance))


def _rope_checks(rec: _Recorder, gen: torch.Generator) -> None:
    case, dtype = rec.case, rec.dtype
    cfg = ComplexRoPE.Config(dim=case.head_dim, max_seq_len=case.seq_len, theta=500000, scaling="llama")
    upstream, override = cfg.build(), npu_rotary_rope(cfg).build()
    positions = case.positions()
    q = torch.randn(case.batch, case.seq_len, case.n_heads, case.head_dim, generator=gen).to(dtype)
    k = torch.randn(case.batch, case.seq_len, case.n_kv_heads, case.head_dim, generator=gen).to(dtype)
    grad = torch.randn(q.numel() + k.numel(), generator=gen)

    def run(rope: Callable[..., tuple[torch.Tensor, torch.Tensor]], **kwargs: object):
        def fn(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return torch.cat([t.flatten() for t in rope(q, k, positions, **kwargs)])

        return _fwd_bwd(fn, (q, k), grad)

    expected = run(upstream)
    rec.compare("rope.reference", run(override), expected, exact=True)
    rec.compare("rope.npu_model", run(override, kernels=MODEL_KERNELS), expected)


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
            out = flex_attention(
                *(x.transpose(1, 2) for x in (q, k, v)),
                block_mask=block_mask,
                enable_gqa=q.shape[2] != k.shape[2],
            )
        assert isinstance(out, torch.Tensor)
        return out.transpose(1, 2)

    return fn


def _attention_checks(rec: _Recorder, gen: torch.Generator) -> None:
    case, dtype = rec.case, rec.dtype
    positions = case.positions()
    metadata = create_varlen_metadata_for_document(positions)
    attention = npu_fused_attention(FlexAttention.Config()).build()

    def override(**kwargs: object) -> Callable[..., torch.Tensor]:
        return lambda q, k, v: attention(q, k, v, attention_masks=metadata, **kwargs)

    shape_q = (case.batch, case.seq_len, case.n_heads, case.head_dim)
    shape_kv = (case.batch, case.seq_len, case.n_kv_heads, case.head_dim)
    q, k, v = (torch.randn(s, generator=gen).to(dtype) for s in (shape_q, shape_kv, shape_kv))
    grad = torch.randn(shape_q, generator=gen)
    allowed = create_mask(_document_mask_mod(positions), case.batch, None, case.seq_len, case.seq_len, device="cpu")

    reference = _fwd_bwd(override(), (q, k, v), grad)
    flex = _fwd_bwd(_flex_attention(positions), (q, k, v), None)
    rec.compare("attention.reference_vs_flex", (reference[0], []), flex)
    math_fp64 = _fwd_bwd(_math_attention(allowed, case.head_dim**-0.5), [x.double() for x in (q, k, v)], grad)
    rec.compare("attention.reference_vs_math", reference, math_fp64)
    rec.compare("attention.npu_model", _fwd_bwd(override(kernels=MODEL_KERNELS), (q, k, v), grad), reference)


def _rms_norm_checks(rec: _Recorder, gen: torch.Generator) -> None:
    case, dtype = rec.case, rec.dtype
    dim = case.n_heads * case.head_dim
    cfg = RMSNorm.Config(normalized_shape=dim)
    upstream, override = cfg.build(), npu_rms_norm(cfg).build()  # weights come in via functional_call
    x = torch.randn(case.batch, case.seq_len, dim, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    grad = torch.randn(x.shape, generator=gen)

    def run(norm: torch.nn.Module, **kwargs: object):
        return _fwd_bwd(lambda x, w: functional_call(norm, {"weight": w}, (x,), kwargs), (x, weight), grad)

    rec.compare("rmsnorm.npu_model", run(override, kernels=MODEL_KERNELS), run(upstream))


def run_checks(seed: int = 0, quick: bool = False) -> list[CheckResult]:
    """Run every check over random cases (2 when ``quick``, else 6) in fp32 and bf16."""
    gen = torch.Generator().manual_seed(seed)
    cases = [_random_case(gen) for _ in range(2 if quick else 6)]
    results: list[CheckResult] = []
    for case in cases:
        for dtype in DTYPES:
            rec = _Recorder(case, dtype)
            for check in (_rope_checks, _attention_checks, _rms_norm_checks):
                check(rec, gen)
            results.extend(rec.results)
    return results


def format_table(results: Sequence[CheckResult]) -> str:
    """The results as an aligned text table."""
    header = ("check", "dtype", "shape", "max error", "tolerance", "ok")
    rows = [
        (r.check, r.dtype, r.shape, f"{r.max_error:.3g}", f"{r.tolerance:.3g}", "ok" if r.ok else "FAIL")
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows])
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    """Print the check table; 0 when every check passes, else 1."""
    parser = argparse.ArgumentParser(
        prog="slurm-titan check-overrides",
        description="Check the NPU overrides on CPU against upstream torchtitan and the torch_npu contract models.",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the random cases")
    parser.add_argument("--quick", action="store_true", help="fewer random cases")
    args = parser.parse_args(argv)
    results = run_checks(seed=args.seed, quick=args.quick)
    print(format_table(results))
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0
