"""Selective AC on NPU saves npu_fusion_attention instead of running it again in backward.

torch_npu is not installed here: a real op registered as ``npu::npu_fusion_attention`` (with a
separate ``npu_fusion_attention_grad`` backward, as op-plugin's derivatives.yaml defines it) stands
in for it, so the override finds it by the same name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torchtitan.config import apply_overrides
from torchtitan.config.manager import ConfigManager
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

from slurm_titan.launch.config import load_config
from slurm_titan.launch.plan import plan_job
from slurm_titan.overrides.npu_selective_ac import NpuSelectiveAC, npu_selective_ac
from tests.support.paths import REPO

CALLS: Counter[str] = Counter()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def _forward(query, key, value, head_num, input_layout):
    CALLS["forward"] += 1
    scores = query @ key.transpose(-1, -2)
    return _attention(query, key, value), scores.logsumexp(-1), 0, 0, 0  # out, softmax stat, seed/offset/numels


def _grad(query, key, value, dy, attention_in, softmax_max):
    CALLS["grad"] += 1
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (query, key, value)]
        return torch.autograd.grad(_attention(*leaves), leaves, dy)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:3], output[0], output[1])


def _backward(ctx, dy, *unused):
    query, key, value, attention_in, softmax_max = ctx.saved_tensors
    grads = torch.ops.npu.npu_fusion_attention_grad(query, key, value, dy, attention_in, softmax_max)
    return *grads, None, None


@pytest.fixture
def npu_op() -> Iterator[torch._ops.OpOverload]:
    """``torch.ops.npu.npu_fusion_attention`` for the test's duration, counting its calls."""
    lib = torch.library.Library("npu", "FRAGMENT")
    lib.define("npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout)"
               " -> (Tensor, Tensor, int, int, int)")
    lib.define("npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, Tensor attention_in,"
               " Tensor softmax_max) -> (Tensor, Tensor, Tensor)")
    lib.impl("npu_fusion_attention", _forward, "CompositeExplicitAutograd")
    lib.impl("npu_fusion_attention_grad", _grad, "CompositeExplicitAutograd")
    torch.library.register_autograd("npu::npu_fusion_attention", _backward, setup_context=_setup_context, lib=lib)
    CALLS.clear()
    yield torch.ops.npu.npu_fusion_attention.default
    lib._destroy()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x + self.out(torch.ops.npu.npu_fusion_attention(q, k, v, 1, "BSH")[0])


class Tiny(nn.Module):
    """What ``ActivationCheckpointing.apply`` wraps: transformer blocks under ``layers``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": Block(), "1": Block()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


def _npu_policy() -> SelectiveAC:
    return npu_selective_ac(SelectiveAC.Config()).build(dump_folder="")


def test_npu_policy_saves_the_fused_attention(npu_op) -> None:
    upstream = SelectiveAC(SelectiveAC.Config()).get_save_ops()
    assert npu_op not in upstream
    assert _npu_policy().get_save_ops() == upstream | {npu_op}


def test_npu_policy_is_upstreams_without_torch_npu() -> None:
    assert not hasattr(torch.ops.npu, "npu_fusion_attention")
    assert _npu_policy().get_save_ops() == SelectiveAC(SelectiveAC.Config()).get_save_ops()


def _train_step(policy: SelectiveAC) -> tuple[Counter[str], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = Tiny()
    policy.apply(model)
    CALLS.clear()
    model(torch.randn(2, 5, 8)).square().sum().backward()
    return Counter(CALLS), [p.grad for p in model.parameters()]


def test_selective_ac_runs_the_npu_attention_once(npu_op) -> None:
    upstream_calls, upstream_grads = _train_step(SelectiveAC(SelectiveAC.Config()))
    npu_calls, npu_grads = _train_step(_npu_policy())
    assert upstream_calls == {"forward": 4, "grad": 2}  # two layers, each recomputed in backward
    assert npu_calls == {"forward": 2, "grad": 2}
    assert all(torch.equal(a, b) for a, b in zip(upstream_grads, npu_grads, strict=True))


@pytest.mark.parametrize(("path", "policy"), [
    ("configs/llama3_8b_npu.yaml", NpuSelectiveAC.Config),
    ("configs/llama3_8b_npu_1node.yaml", NpuSelectiveAC.Config),
    ("configs/llama3_70b_npu.yaml", FullAC.Config),
], ids=["8b", "8b-1node", "70b-full-ac"])
def test_npu_configs_get_the_policy(path: str, policy: type) -> None:
    """The rank command a job runs, parsed and overridden the way torchtitan's trainer does."""
    _, argv = plan_job(load_config(REPO / path)).node.resolve("1")
    config = ConfigManager().parse_args(argv[4:])
    config.model_spec.model.update_from_config(config=config)
    apply_overrides(config.override, config)
    assert type(config.activation_checkpoint) is policy
