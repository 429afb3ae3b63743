"""cpu_offload_gb applied for real: offloaded layers hold no weights between forwards, their
weights live in a separate host store (pinned when CUDA exists), each forward streams fresh
copies to the compute device, and the outputs do not change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS, TINY_MOE_CONFIGS

from turnout.engine.model import load_model, write_random_weights
from turnout.engine.model.attention_metadata import AttentionMetadata
from turnout.engine.model_info import engine_config_for
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.sampling_params import SamplingParams
from turnout.runner_v1.cpu_offload import (
    GIB,
    apply_cpu_offload,
    decoder_layers,
    resident_parameter_bytes,
)

CONFIG = {**TINY_DECODER_CONFIGS["llama"], "num_hidden_layers": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("offload-llama")
    write_random_weights(CONFIG, path, dtype=torch.float32, seed=5)
    return path


def layer_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in decoder_layers(model)[0].parameters())


def generate(model_dir: Path, device: str, cpu_offload_gb: float):
    config = engine_config_for(
        model_dir, device=device, max_model_len=128, num_kv_blocks=64, cpu_offload_gb=cpu_offload_gb
    )
    core = build_engine_core(config, "v1")
    prompts = {"a": [5, 9, 11, 30, 2, 7], "b": list(range(3, 40))}
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    for req_id, prompt in prompts.items():
        core.add_request(req_id, prompt, params)
    done = {r.req_id: r for r in core.run_until_done()}
    return core, done


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_offloaded_layers_stream_their_weights(model_dir: Path, device: str) -> None:
    base_core, base = generate(model_dir, device, 0.0)
    one_layer = layer_bytes(base_core.runner.model)
    gb = 1.5 * one_layer / GIB  # more than one layer: two layers are offloaded
    core, done = generate(model_dir, device, gb)
    runner, stats = core.runner, core.runner.offload_stats
    assert stats.num_offloaded_layers == 2 and stats.offloaded_bytes == 2 * one_layer
    assert (
        stats.num_transfers == 2 * core.num_steps
        and stats.transferred_bytes == stats.num_transfers * one_layer
    )
    layers = decoder_layers(runner.model)
    # Between forwards the offloaded layers hold only meta placeholders; the others are resident.
    assert all(p.is_meta for layer in layers[:2] for p in layer.parameters())
    assert not any(p.is_meta for layer in layers[2:] for p in layer.parameters())
    assert (
        resident_parameter_bytes(runner.model)
        == resident_parameter_bytes(base_core.runner.model) - 2 * one_layer
    )
    # The host store is separate CPU memory, pinned when CUDA exists.
    assert all(t.device.type == "cpu" for t in stats.host_store.values())
    assert all(t.is_pinned() == torch.cuda.is_available() for t in stats.host_store.values())
    for req_id, req in done.items():
        assert req.output_token_ids == base[req_id].output_token_ids
        for got, want in zip(req.logprobs, base[req_id].logprobs, strict=True):
            assert (got.token_ids == want.token_ids).all()
            assert abs(got.logprobs - want.logprobs).max() <= 1e-5


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_each_forward_uses_fresh_device_copies(model_dir: Path, device: str) -> None:
    model = load_model(model_dir, device=device)
    stats = apply_cpu_offload(model, 1e-9, torch.device(device))  # the first layer only
    assert stats.num_offloaded_layers == 1
    host = stats.host_store["layers.0.self_attn.qkv_proj.weight"]
    layer = decoder_layers(model)[0]
    seen = []
    layer.self_attn.qkv_proj.register_forward_pre_hook(
        lambda m, args: seen.append(
            (m.weight.device.type, m.weight.data_ptr(), m.weight.detach().cpu().clone())
        )
    )
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    kv = torch.zeros(2, 4, 4, CONFIG["num_key_value_heads"], head_dim, device=device)
    md = AttentionMetadata(
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([3], dtype=torch.int32, device=device),
        block_table=torch.tensor([[0]], dtype=torch.int32, device=device),
        slot_mapping=torch.arange(3, device=device),
        max_query_len=3,
        max_seq_len=3,
        num_actual_tokens=3,
        block_size=4,
    )
    hidden, positions = (
        torch.randn(3, CONFIG["hidden_size"], device=device),
        torch.arange(3, device=device),
    )
    with torch.inference_mode():
        for _ in range(2):
            layer(positions, hidden, model.model.rotary_emb, kv, md)
    assert stats.num_transfers == 2 and len(seen) == 2
    for device_type, ptr, weight in seen:
        assert device_type == device
        assert ptr != host.data_ptr()  # the compute never reads the host store directly
        assert torch.equal(weight, host)
    assert layer.self_attn.qkv_proj.weight.is_meta  # dropped again after the forward


def test_opt_layers_are_found_and_offloaded() -> None:
    # OPT keeps its layers under model.decoder.layers (HF's names).
    from paged_session import run_paged_forced
    from tiny_opt_configs import TINY_OPT_CONFIGS

    from turnout.engine.model import ModelConfig

    config = ModelConfig.from_hf_dict(TINY_OPT_CONFIGS["opt-pre-ln-project"])
    resident, offloaded = load_model(config, seed=1), load_model(config, seed=1)
    assert decoder_layers(offloaded) is offloaded.model.decoder.layers
    stats = apply_cpu_offload(offloaded, 1e-9, torch.device("cpu"))
    assert stats.num_offloaded_layers == 1
    seqs = {"a": list(range(3, 20))}
    want = run_paged_forced(resident, seqs, block_size=4, first_chunk={"a": 9}, num_decode=3)
    got = run_paged_forced(offloaded, seqs, block_size=4, first_chunk={"a": 9}, num_decode=3)
    assert torch.equal(got["a"], want["a"]) and stats.num_transfers == 5


def test_an_moe_model_streams_its_stacked_experts(tmp_path: Path) -> None:
    # Qwen2-MoE: layer 0 sparse (stacked experts, router, gated shared expert), layer 1 dense.
    write_random_weights(TINY_MOE_CONFIGS["qwen2-moe"], tmp_path, dtype=torch.float32, seed=6)
    _, base = generate(tmp_path, "cpu", 0.0)
    core, done = generate(tmp_path, "cpu", 1e-9)  # the first (sparse) layer only
    stats = core.runner.offload_stats
    assert stats.num_offloaded_layers == 1 and "layers.0.mlp.experts.w13" in stats.host_store
    assert decoder_layers(core.runner.model)[0].mlp.experts.w13.is_meta
    for req_id, req in done.items():
        assert req.output_token_ids == base[req_id].output_token_ids
