"""DeploymentConfig: checked on construction, frozen, hashable, built from every source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from turnout.oracle import ConfigError, DeploymentConfig, from_command, from_hf_config, from_spec
from turnout.oracle.coerce import KIND_CHECKS
from turnout.oracle.config import CONFIG_FIELD_NAMES, DEFAULTS, FIELD_INFO
from turnout.oracle.errors import ErrorCode
from turnout.oracle.fields import PLATFORMS, declare, field_infos
from turnout.oracle.sources.spec import load_specs

REF = Path(__file__).resolve().parents[2] / "policies" / "reference"


def test_every_field_is_declared_once_on_the_dataclass() -> None:
    init_fields = [f.name for f in dataclasses.fields(DeploymentConfig) if f.init]
    assert list(CONFIG_FIELD_NAMES) == init_fields == list(FIELD_INFO)
    assert FIELD_INFO["tensor_parallel_size"].minimum == 1
    assert FIELD_INFO["ubatch_size"].minimum == 0
    assert FIELD_INFO["platform"].vocab == PLATFORMS and FIELD_INFO["platform"].group == "platform"
    assert FIELD_INFO["architecture"].changeable is False
    assert DEFAULTS["compilation_mode"] == "vllm_compile" and DEFAULTS["env"] == {}
    # The checks name no field: which check a field gets is said by its declaration alone.
    source = (Path(__file__).resolve().parents[2] / "oracle" / "coerce.py").read_text()
    named = [
        n
        for n in CONFIG_FIELD_NAMES
        if n not in KIND_CHECKS  # "env": a kind too
        and (f'"{n}"' in source or f"'{n}'" in source)
    ]
    assert not named, named


def test_field_infos_names_declared_fields_only() -> None:
    @dataclasses.dataclass
    class Toy:
        a: int = declare(3, "int", "an a", "g", minimum=2)
        b: str = "plain"

    (info,) = field_infos(Toy)
    assert (info.name, info.kind, info.doc, info.minimum) == ("a", "int", "an a", 2)
    assert Toy().a == 3


def test_min_and_mtp_checks_come_from_the_declarations() -> None:
    with pytest.raises(ConfigError, match="data_parallel_size: expected an integer >= 1"):
        DeploymentConfig(data_parallel_size=0)
    assert DeploymentConfig(ubatch_size=0).ubatch_size == 0
    assert DeploymentConfig(speculative_method="qwen3-next-MTP").speculative_method == "mtp"
    assert DeploymentConfig(quantization=False).quantization == "none"
    with pytest.raises(ConfigError, match="compilation_mode: unknown value 'x_mtp'"):
        DeploymentConfig(compilation_mode="x_mtp")  # the MTP names belong to speculative_method


def test_frozen_and_hashable_by_value() -> None:
    a = DeploymentConfig(architecture="Qwen3ForCausalLM", env={"X": "1"})
    b = DeploymentConfig(architecture="Qwen3ForCausalLM", env={"X": "1"})
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.architecture = "x"  # type: ignore[misc]
    assert a != a.replace(tensor_parallel_size=2)


def test_coercion_and_defaults() -> None:
    c = DeploymentConfig(
        architecture="A",
        tensor_parallel_size="4",
        enable_dbo="true",
        speculative_method="Deepseek_MTP",
        logits_processors="a.b:C",
        quantization=None,
        platform=None,
    )
    assert c.tensor_parallel_size == 4 and c.enable_dbo is True
    assert c.speculative_method == "mtp" and c.logits_processors == ("a.b:C",)
    assert c.quantization == "none" and c.platform == "cuda"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size: expected an integer >= 1"),
        ({"tensor_parallel_size": True}, "expected an integer"),
        ({"platform": "gpu"}, "platform: unknown value 'gpu'"),
        ({"enable_dbo": "maybe"}, "enable_dbo: expected true or false"),
        ({"cpu_offload_gb": -1}, "cpu_offload_gb: expected a number >= 0"),
        ({"env": {"A": [1]}}, "env: expected string names and scalar values"),
        ({"mamba_cache_mode": "everything"}, "expected one of none, align, all"),
        # Huge and non-finite values: refused by name, never carried into JSON (inf is not JSON).
        (
            {"tensor_parallel_size": 10**30},
            "tensor_parallel_size: expected an integer <= 2147483647",
        ),
        ({"tensor_parallel_size": "²"}, "tensor_parallel_size: expected an integer, got '²'"),
        ({"cpu_offload_gb": float("inf")}, "cpu_offload_gb: expected a finite number"),
        ({"cpu_offload_gb": "inf"}, "cpu_offload_gb: expected a finite number"),
        ({"cpu_offload_gb": float("nan")}, "cpu_offload_gb: expected a number >= 0"),
        ({"model": "m" * 5000}, "model: expected at most 1024 characters"),
        ({"logits_processors": ["a:B"] * 65}, "logits_processors: expected at most 64 entries"),
        ({"env": {f"V{i}": "1" for i in range(65)}}, "env: expected at most 64"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        DeploymentConfig(**kwargs)
    assert fragment in info.value.message and info.value.code == ErrorCode.BAD_VALUE


def test_replace_names_an_unknown_field() -> None:
    c = DeploymentConfig(architecture="LlamaForCausalLM")
    with pytest.raises(ConfigError) as info:
        c.replace(tensor_paralel_size=2)  # turnout decide --set tensor_paralel_size=2
    assert info.value.code == ErrorCode.UNKNOWN_FIELD
    assert "did you mean 'tensor_parallel_size'" in info.value.message
    assert c.replace(tensor_parallel_size=2).tensor_parallel_size == 2


def test_spec_round_trip() -> None:
    c = DeploymentConfig(
        architecture="LlamaForCausalLM",
        speculative_method="eagle3",
        logits_processors=("a:B",),
        env={"TURNOUT_USE_V2_MODEL_RUNNER": "1"},
    )
    spec = c.to_spec()
    assert json.loads(json.dumps(spec)) == spec
    assert from_spec(spec) == c


def test_spec_file_errors_name_file_line_column(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "- id: a\n  architecture: Qwen3ForCausalLM\n"
        "- id: b\n  architecture: Qwen3ForCausalLM\n  tensor_parallel_size: lots\n"
        "- id: c\n  archtecture: Qwen3ForCausalLM\n"
    )
    a, b, c = load_specs(f)
    assert a.config is not None and a.id == "a"
    assert b.config is None and b.error == (
        f"{f}:5:25: tensor_parallel_size: expected an integer, got 'lots'"
    )
    assert c.error is not None and c.error.startswith(f"{f}:7:3: unknown field 'archtecture'")
    assert "did you mean 'architecture'" in c.error


def test_jsonl_bad_line_is_rejected_alone(tmp_path: Path) -> None:
    f = tmp_path / "fleet.jsonl"
    f.write_text(
        '{"id": "x", "architecture": "Qwen3ForCausalLM"}\n{"id": "y", oops}\n'
        '{"id": "z", "config": {"architecture": "LlamaForCausalLM"}, "want": {}}\n'
    )
    x, y, z = load_specs(f)
    assert x.config is not None and z.config is not None and z.id == "z"
    assert y.config is None and y.error is not None and y.error.startswith(f"{f}:2:")


@pytest.mark.parametrize(
    "name, arch, facts",
    [
        ("qwen3-30b-a3b.json", "Qwen3MoeForCausalLM", {"is_moe": True}),
        ("deepseek-v2-lite.json", "DeepseekV2ForCausalLM", {"is_moe": True, "use_mla": True}),
        ("jamba-v0.1.json", "JambaForCausalLM", {"is_moe": True}),
        ("granite-3.0-1b-a400m.json", "GraniteMoeForCausalLM", {"is_moe": True}),
        ("qwen3-8b.json", "Qwen3ForCausalLM", {"is_moe": None, "use_mla": None}),
        ("all-minilm-l6-v2.json", "BertModel", {}),
    ],
)
def test_from_hf_config_reads_real_configs(name: str, arch: str, facts: dict) -> None:
    c = from_hf_config(REF / "model_configs" / name)
    assert c.architecture == arch
    for key, value in facts.items():
        assert getattr(c, key) == value


def test_from_hf_config_quantization(tmp_path: Path) -> None:
    data = json.loads((REF / "model_configs" / "quantized-examples.json").read_text())
    qc = data["examples"][0]["quantization_config_seen"]
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "quantization_config": qc}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = from_hf_config(tmp_path, platform="rocm")
    assert c.quantization == "gptq" and c.platform == "rocm"


def test_from_hf_config_without_architectures() -> None:
    with pytest.raises(ConfigError, match="architectures"):
        from_hf_config({"model_type": "llama"})


def test_from_command_local_directory(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    c = from_command(["vllm", "serve", str(model), "-tp", "2"], {})
    assert c.architecture == "MistralForCausalLM" and c.tensor_parallel_size == 2


def test_from_command_config_file_and_cli_precedence(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text(
        "tensor-parallel-size: 4\nenable_dbo: true\nspeculative-config: {method: suffix}\n"
    )
    c = from_command("vllm serve Qwen/Qwen3-8B --config serve.yaml -tp 2", {}, base_dir=tmp_path)
    assert c.tensor_parallel_size == 2 and c.enable_dbo and c.speculative_method == "suffix"


def test_from_command_shell_string_with_env_prefix() -> None:
    c = from_command(
        "TURNOUT_USE_V2_MODEL_RUNNER=1 CUDA_VISIBLE_DEVICES=0 vllm serve Qwen/Qwen3-8B", {}
    )
    assert dict(c.env) == {"TURNOUT_USE_V2_MODEL_RUNNER": "1"}
