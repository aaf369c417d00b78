from pathlib import Path

import pytest

from slurm_titan.errors import ConfigError
from slurm_titan.launch.config import load_config, parse_assignment
from slurm_titan.launch.preflight import STANDBY_RANK_BYTES, preflight_expectations
from tests.support.paths import REPO


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_debug_cpu_config_loads() -> None:
    config = load_config(REPO / "configs/debug_cpu.yaml")
    assert config.slurm.nodes == 2
    assert config.environment.device == "cpu"
    assert config.torchtitan.args["training"]["steps"] >= 10


def test_flags_and_set_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nslurm: {nodes: 2}\n")
    config = load_config(path, [("slurm.nodes", 8), parse_assignment("torchtitan.args.training.steps=20"),
                                parse_assignment("slurm.extra.mem-per-cpu=2G")])
    assert config.slurm.nodes == 8
    assert config.torchtitan.args == {"training": {"steps": 20}}
    assert config.slurm.extra == {"mem-per-cpu": "2G"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nslurm: {nodez: 2}\n", "job.yaml: slurm.nodez: unknown key (did you mean 'nodes'?)"),
        ("name: x\nslurm: {nodes: two}\n", "job.yaml: slurm.nodes: expected int, got 'two'"),
        ("name: x\nslurm: {nodes: 0}\n", "job.yaml: slurm.nodes: must be >= 1, got 0"),
        ("name: x\nslurm: {nodes: true}\n", "job.yaml: slurm.nodes: expected int, got True"),
        ("name: x\nslurm: {time: '1:75:00'}\n", "job.yaml: slurm.time: bad time '1:75:00'"),
        ("name: x\nslurm: {time: soon}\n", "job.yaml: slurm.time: bad time 'soon'"),
        ("name: x\nenvironment: {device: tpu}\n",
         "job.yaml: environment.device: must be one of 'npu' | 'cpu' | 'cuda'"),
        ("slurm: {nodes: 1}\n", "job.yaml: name: is required"),
        ("name: 'a b'\n", "job.yaml: name: 'a b' must be letters"),
        ("name: x\ntorchtitan: {override_imports: notalist}\n", "job.yaml: torchtitan.override_imports: expected list"),
        ("name: x\nslurm: {port_window: [100, 200]}\n", "job.yaml: slurm.port_window: must be [low, high]"),
        ("name: x\ncheckpoint: {enable: true, upload_rate: -1}\n",
         "job.yaml: checkpoint.upload_rate: must be >= 0, got -1.0"),
        ("name: x\ncheckpoint: {enable: true, upload_cpus: '8-4'}\n",
         "job.yaml: checkpoint.upload_cpus: '8-4' in '8-4': the range runs backwards"),
        ("name: x\nslurm: {gres: 'npu::8'}\n",
         "job.yaml: slurm.gres: 'npu::8' in 'npu::8' is not name[:type][:count] (Slurm --gres)"),
        ("name: x\nslurm: {gres: 'npu:8,gpu 2'}\n", "job.yaml: slurm.gres: 'gpu 2' in 'npu:8,gpu 2' is not"),
        ("name: x\nslurm: {devices_per_node: 8, gres: 'npu:4'}\n",
         "job.yaml: slurm.gres: 'npu:4' gives each node 4 NPUs but slurm.devices_per_node is 8"),
        ("name: x\nslurm: {extra: {gres: 'npu:8'}}\n", "job.yaml: slurm.extra.gres: set slurm.gres instead"),
        ("name: x\ntorchtitan: {args: {parallelism: {context_parallel_degree: 2}}}\n",
         "job.yaml: torchtitan.args.parallelism.context_parallel_degree: 2: the NPU attention"),
        ("name: x\ntorchtitan: {args: {parallelism: {spmd_backend: full_dtensor}}}\n",
         "job.yaml: torchtitan.args.parallelism.spmd_backend: 'full_dtensor' hands the NPU RoPE and attention"),
        ("name: x\ntorchtitan: {args: {parallelism: {spmd_backend: partial_dtensor}}}\n",
         "job.yaml: torchtitan.args.parallelism.spmd_backend: 'partial_dtensor' hands the NPU RoPE"),
        ("name: x\ntorchtitan: {args: {compile: {enable: true}}}\n",
         "job.yaml: torchtitan.args.compile.enable: torch.compile needs triton-ascend"),
        ("name: x\ntorchtitan: {args: {comm: {train_timeout_seconds: 100}}}\n",
         "job.yaml: torchtitan.args.comm.train_timeout_seconds: comes from the timeouts section"),
        ("name: x\ntimeouts: {collective_s: 0}\n", "job.yaml: timeouts.collective_s: must be >= 1, got 0"),
        ("name: x\nenvironment: {npu: {exec_timeout_s: 1836}}\n",
         "job.yaml: environment.npu.exec_timeout_s: moved: set timeouts.collective_s"),
        ("name: x\ncheckpoint: {enable: true, remote: /r, memory: {enable: true, interval: 0}}\n",
         "job.yaml: checkpoint.memory.interval: must be >= 1 or auto, got 0"),
        ("name: x\ncheckpoint: {enable: true, memory: {enable: true}}\n",
         "job.yaml: checkpoint.memory.enable: the RAM tier stands in front of the store: set checkpoint.remote too"),
        ("name: x\ncheckpoint: {enable: true, remote: /r, memory: {enable: true, dir: shm}}\n",
         "job.yaml: checkpoint.memory.dir: must be an absolute path, got 'shm'"),
        ("name: x\ncheckpoint: {memory: {interval: often}}\n",
         "job.yaml: checkpoint.memory.interval: expected int or 'auto', got 'often'"),
        ("- just\n- a list\n", "job.yaml: must be a YAML mapping"),
        ("name: x\nslurm: {nodes: [\n", "job.yaml: line"),
    ],
)
def test_bad_config_names_file_key_and_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_set_into_a_scalar_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="slurm.nodes: is not a section"):
        load_config(write(tmp_path, "name: x\nslurm: {nodes: 1}\n"), [("slurm.nodes.x", 1)])


def test_bad_assignment_syntax() -> None:
    with pytest.raises(ConfigError, match="is not KEY.PATH=VALUE"):
        parse_assignment("slurm.nodes")


@pytest.mark.parametrize(
    ("device", "gres", "wanted"),
    [("npu", None, "npu:8"), ("npu", "none", None), ("npu", "npu:16", "npu:16"), ("cpu", None, None),
     ("cuda", "gpu:a100:8", "gpu:a100:8")],
)
def test_gres_default_follows_the_device(tmp_path: Path, device: str, gres: str | None, wanted: str | None) -> None:
    sets = [("environment.device", device)] + ([("slurm.gres", gres)] if gres else [])
    config = load_config(write(tmp_path, "name: x\nslurm: {devices_per_node: 8}\n"), sets)
    assert config.slurm.gres_request(device) == wanted
    null = load_config(write(tmp_path, "name: x\nslurm: {gres: null}\n"))
    assert null.slurm.gres_request("npu") is None


def test_spmd_backend_from_set_is_refused_on_npu_and_the_default_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\n")
    with pytest.raises(ConfigError, match="parallelism.spmd_backend: 'full_dtensor' hands"):
        load_config(path, [parse_assignment("torchtitan.args.parallelism.spmd_backend=full_dtensor")])
    config = load_config(path, [parse_assignment("torchtitan.args.parallelism.spmd_backend=spmd_types")])
    assert config.torchtitan.option("parallelism.spmd_backend") == "spmd_types"
    cpu = load_config(path, [("environment.device", "cpu"),
                             ("torchtitan.args.parallelism.spmd_backend", "full_dtensor")])
    assert cpu.torchtitan.option("parallelism.spmd_backend") == "full_dtensor"


def test_cpu_jobs_may_use_context_parallelism_and_compile(tmp_path: Path) -> None:
    text = "name: x\nenvironment: {device: cpu}\ntorchtitan: {args: {parallelism: {context_parallel_degree: 2}, " \
           "compile: {enable: true}}}\n"
    assert load_config(write(tmp_path, text)).torchtitan.option("compile.enable") is True


def test_the_preflight_counts_a_standby_steps_processes_when_it_is_on() -> None:
    npu = REPO / "configs/llama3_8b_npu_1node.yaml"
    assert preflight_expectations(load_config(npu), None).standby_bytes is None
    on = load_config(npu, [("preemption.standby_step", True)])
    assert preflight_expectations(on, None).standby_bytes == on.slurm.devices_per_node * STANDBY_RANK_BYTES


def test_doctor_check_kernels_is_off_by_default_and_for_npu_jobs_only() -> None:
    npu = REPO / "configs/llama3_8b_npu_1node.yaml"
    assert load_config(npu).doctor.check_kernels is False
    assert preflight_expectations(load_config(npu, [("doctor.check_kernels", True)]), None).check_kernels
    with pytest.raises(ConfigError, match="doctor.check_kernels: checks the NPU kernels: needs environment.device"):
        load_config(REPO / "configs/debug_cpu.yaml", [("doctor.check_kernels", True)])
    with pytest.raises(ConfigError, match="doctor.check_kernels: expected bool, got 'yes'"):
        load_config(npu, [("doctor.check_kernels", "yes")])


@pytest.mark.parametrize(("text", "message"), [
    ("straggler: {threshold: 1.5}", "straggler.threshold: must be within (0, 1), got 1.5"),
    ("straggler: {threshold: 0}", "straggler.threshold: must be within (0, 1), got 0.0"),
    ("straggler: {window_steps: 0}", "straggler.window_steps: must be >= 1 (or null: sized from the step time), got 0"),
    ("straggler: {action: kick}", "straggler.action: expected 'swap' | 'alert' | 'off' or null, got 'kick'"),
    ("straggler: {threshold: fast}", "straggler.threshold: expected float, got 'fast'"),
])
def test_bad_straggler_settings_are_one_line_each(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, f"name: x\n{text}\n"))
    assert str(error.value) == f"{tmp_path / 'job.yaml'}: {message}"


def test_straggler_defaults_swap_with_a_spare_and_warn_for_swap_without(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    config = load_config(write(tmp_path, "name: x\ncheckpoint: {enable: true}\nstraggler: {threshold: 0.75}\n"))
    assert config.straggler.threshold == 0.75 and config.straggler.resolved_action(0) == "alert"
    assert config.straggler.resolved_action(1) == "swap"
    config = load_config(write(tmp_path, "name: x\ncheckpoint: {enable: true}\nstraggler: {action: swap}\n"))
    assert config.straggler.resolved_action(0) == "alert"
    assert capsys.readouterr().err == (f"slurm-titan: WARNING: {tmp_path / 'job.yaml'}: straggler.action is swap "
                                       "but slurm.spare_nodes is 0: a slow node will only be alerted\n")
    assert load_config(write(tmp_path, "name: x\nstraggler: {action: 'off'}\n")).straggler.resolved_action(1) == "off"
