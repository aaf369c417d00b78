"""The overrides applied to llama3_debugmodel through torchtitan's own override mechanism."""

import pytest
import torch
from torchtitan.config import apply_overrides
from torchtitan.config.manager import ConfigManager
from torchtitan.models.common.attention import FlexAttention, create_varlen_metadata_for_document
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.models.common.rope import ComplexRoPE

from slurm_titan.overrides import DEFAULT_CPU_OVERRIDES, DEFAULT_NPU_OVERRIDES, npu_attention, npu_norm, npu_rope
from slurm_titan.overrides.document_tables import collate_with_tables
from slurm_titan.overrides.kernel_models import MODEL_KERNELS
from slurm_titan.overrides.npu_attention import NpuFusedAttention
from slurm_titan.overrides.npu_capabilities import RefuseAscendUnsupported, RefuseHostSync
from slurm_titan.overrides.npu_norm import NpuRMSNorm
from slurm_titan.overrides.npu_rope import NpuComplexRoPE


def _debugmodel_config(targets: tuple[str, ...]):
    """Parse like torchtitan's CLI, then apply overrides in the trainer's order."""
    config = ConfigManager().parse_args(
        ["--module", "llama3", "--config", "llama3_debugmodel", "--override.imports", ",".join(targets)]
    )
    config.model_spec.model.update_from_config(config=config)
    return config, apply_overrides(config.override, config)


@pytest.fixture(scope="module")
def npu_config():
    return _debugmodel_config(DEFAULT_NPU_OVERRIDES)


def test_npu_defaults_replace_attention_rope_and_norms(npu_config):
    config, applied = npu_config
    model = config.model_spec.model
    assert len(applied) == 6 + 6 + 13 + 1  # per layer: attention, rope, 2 norms; the final norm; selective AC
    for layer in model.layers:
        assert type(layer.attention.inner_attention) is NpuFusedAttention.Config
        assert type(layer.attention.rope) is NpuComplexRoPE.Config
        assert type(layer.attention_norm) is type(layer.ffn_norm) is NpuRMSNorm.Config
    assert type(model.norm) is NpuRMSNorm.Config
    assert not any(model.traverse(FlexAttention.Config))
    rope = model.layers[0].attention.rope
    assert (rope.theta, rope.scaling, rope.max_seq_len) == (500000, "llama", config.training.seq_len)


def test_cpu_defaults_replace_attention_only():
    config, applied = _debugmodel_config(DEFAULT_CPU_OVERRIDES)
    model = config.model_spec.model
    assert len(applied) == len(model.layers)
    assert type(model.layers[0].attention.rope) is ComplexRoPE.Config
    assert type(model.norm) is RMSNorm.Config


def test_debugmodel_trains_on_cpu_with_per_document_masking(npu_config):
    config, _ = npu_config
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    model.init_states(buffer_device=torch.device("cpu"))
    positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(2, 1)
    tokens = torch.randint(0, 2048, (2, 64))
    edited = tokens.clone()
    edited[:, 50] = (edited[:, 50] + 1) % 2048  # a token of the second document

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        return model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))

    out = logits(tokens)
    out.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
    with torch.no_grad():
        changed = (logits(edited) - out).abs().amax(dim=(0, 2))
    assert changed[:50].max() == 0  # the first document (and earlier tokens) cannot see it
    assert changed[50:].min() > 0


@pytest.mark.parametrize("batch", [1, 2])
def test_debugmodel_npu_paths_train_on_the_contract_models_without_complex_kernels(npu_config, monkeypatch, batch):
    # Every override takes its NPU path with the contract models, as if the tensors were on an NPU.
    for module in (npu_attention, npu_norm, npu_rope):
        monkeypatch.setattr(module, "select_kernels", lambda kernels, *tensors: MODEL_KERNELS)
    config, _ = npu_config
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    model.init_states(buffer_device=torch.device("cpu"))
    positions = torch.cat([torch.arange(40), torch.arange(24)]).repeat(batch, 1)
    tokens = torch.randint(0, 2048, (batch, 64))
    with RefuseAscendUnsupported():
        out = model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
        out.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_a_loader_batch_gets_its_masks_from_host_tables_with_no_host_sync(npu_config):
    config, _ = npu_config
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    model.init_states(buffer_device=torch.device("cpu"))
    positions = torch.stack([torch.cat([torch.arange(40), torch.arange(24)]), torch.arange(64)])
    tokens = torch.randint(0, 2048, (2, 64))
    inputs = collate_with_tables([({"input": t, "positions": p}, t) for t, p in zip(tokens, positions)])[0]
    inputs["positions"] = inputs["positions"].clone()  # the trainer stores the device copy, a new tensor
    expected = model(tokens, positions=positions, attention_masks=create_varlen_metadata_for_document(positions))
    with RefuseHostSync():  # torchtitan's masks: a nonzero per row and an .item(), each a sync on a device
        masks = model.get_attention_masks(inputs["positions"])
        out = model(inputs["input"], positions=inputs["positions"], attention_masks=masks)
    assert masks.cu_seq_q_host == (0, 40, 64, 128)
    assert torch.equal(out, expected)
