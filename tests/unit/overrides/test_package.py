"""The override target names: importable without torch, each naming a registered override."""

import importlib
import subprocess
import sys

import slurm_titan.overrides as overrides


def test_package_import_does_not_load_torch():
    code = "import sys, slurm_titan.overrides; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_defaults_are_known_targets():
    assert set(overrides.DEFAULT_NPU_OVERRIDES) == set(overrides.OVERRIDE_TARGETS)
    assert overrides.DEFAULT_CPU_OVERRIDES == (overrides.NPU_FUSED_ATTENTION,)
    assert all(isinstance(target, str) for target in overrides.OVERRIDE_TARGETS)


def test_every_target_names_a_registered_override():
    from torchtitan.config.override import _REGISTRY

    for target in overrides.OVERRIDE_TARGETS:
        module, _, function = target.rpartition(".")
        importlib.import_module(module)
        assert _REGISTRY[target].factory.__name__ == function
