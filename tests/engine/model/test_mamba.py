"""Mamba-1 in the model layer against HF transformers (fp32, CPU): the logits of a prompt run
whole, in chunks carrying the state, and token by token equal HF's; several requests in one
packed step keep their states apart; the config fields are read as HF names them; a forward
without state slots is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_mamba_configs import TINY_MAMBA, write_hf_mamba

from turnout.engine.model import AttentionMetadata, ModelConfig, ModelConfigError, load_model
from turnout.engine.model.mamba import MambaForCausalLM
from turnout.engine.model.state_cache import HybridCacheSpec, MambaState

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_mamba(TINY_MAMBA, tmp_path_factory.mktemp("mamba"), seed=4)


def _md(lengths: list[int], slots: list[int], continuing: bool = False) -> AttentionMetadata:
    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return AttentionMetadata(
        query_start_loc=qsl,
        seq_lens=torch.zeros(len(lengths), dtype=torch.int32),
        block_table=torch.zeros(len(lengths), 1, dtype=torch.int32),
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        max_query_len=max(lengths),
        max_seq_len=0,
        num_actual_tokens=int(qsl[-1]),
        block_size=16,
        state_indices=torch.tensor(slots, dtype=torch.int32),
        all_states_continue=continuing,
    )


def _hf_logits(path: Path, prompt: list[int]) -> torch.Tensor:
    hf = transformers.MambaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float()


def _run_chunks(
    model: MambaForCausalLM, caches: list, prompt: list[int], chunks: list[int], slot: int
) -> torch.Tensor:
    out, pos = [], 0
    for n in chunks:
        ids = torch.tensor(prompt[pos : pos + n])
        with torch.no_grad():
            hidden = model(
                ids, torch.arange(pos, pos + n), caches, _md([n], [slot], continuing=pos > 0)
            )
        out.append(model.compute_logits(hidden))
        pos += n
    return torch.cat(out)


@pytest.mark.parametrize("chunks", [[23], [7, 3, 13], [1] * 23, [2, 1, 20]], ids=str)
def test_logits_equal_hf_whole_chunked_and_stepwise(mamba_dir: Path, chunks: list[int]) -> None:
    prompt = torch.randint(
        3, TINY_MAMBA["vocab_size"], (23,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    model = load_model(mamba_dir)
    assert isinstance(model, MambaForCausalLM)
    caches = model.kv_cache_spec.allocate(1, 16, 4, torch.float32, "cpu")
    # A slot that held another request's state: position 0 must start from zero, not from it.
    for c in caches:
        c.conv.normal_()
        c.ssm.normal_()
    got = _run_chunks(model, caches, prompt, chunks, slot=2)
    torch.testing.assert_close(got, _hf_logits(mamba_dir, prompt), atol=1e-4, rtol=1e-4)


def test_requests_in_one_step_keep_their_states_apart(mamba_dir: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randint(3, 160, (n,), generator=gen).tolist() for n in (9, 14))
    model = load_model(mamba_dir)
    caches = model.kv_cache_spec.allocate(1, 16, 4, torch.float32, "cpu")
    with torch.no_grad():  # step 1: a's first 5 tokens and all of b, in one packed batch
        h1 = model(
            torch.tensor(a[:5] + b),
            torch.tensor([*range(5), *range(14)]),
            caches,
            _md([5, 14], [3, 0]),
        )
        h2 = model(
            torch.tensor(a[5:]), torch.arange(5, 9), caches, _md([4], [3])
        )  # a resumes alone
    want_a, want_b = _hf_logits(mamba_dir, a), _hf_logits(mamba_dir, b)
    torch.testing.assert_close(
        model.compute_logits(torch.cat([h1[:5], h2])), want_a, atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(model.compute_logits(h1[5:]), want_b, atol=1e-4, rtol=1e-4)


def test_config_fields_read_as_hf_names_them() -> None:
    c = ModelConfig.from_hf_dict(TINY_MAMBA)
    assert c.architecture == "MambaForCausalLM" and c.has_inner_state and c.tie_word_embeddings
    assert c.mamba is not None
    assert (c.mamba.d_inner, c.mamba.d_state, c.mamba.d_conv, c.mamba.dt_rank) == (128, 8, 4, 8)
    assert c.rms_norm_eps == TINY_MAMBA["layer_norm_epsilon"] and c.max_position_embeddings == 2048
    assert (
        ModelConfig.from_hf_dict({**TINY_MAMBA, "time_step_rank": "auto"}).mamba.dt_rank == 4
    )  # ceil(64/16)
    spec = MambaForCausalLM.kv_cache_spec_for(c)
    assert isinstance(spec, HybridCacheSpec) and spec.bytes_per_block(16, torch.float32) == 0
    # per layer: conv 128 x 3 fp32 + ssm 128 x 8 fp32
    assert spec.state_bytes_per_slot(torch.float32) == 2 * (128 * 3 * 4 + 128 * 8 * 4)
    with pytest.raises(ModelConfigError, match="state_size"):
        ModelConfig.from_hf_dict({**TINY_MAMBA, "state_size": 0})
    # width 1 would leave a conv state of no inputs: the kernels need >= 2 (found by a first
    # forward that failed the whole batch)
    with pytest.raises(ModelConfigError, match="`conv_kernel` must be an integer >= 2, got 1"):
        ModelConfig.from_hf_dict({**TINY_MAMBA, "conv_kernel": 1})
    with pytest.raises(ModelConfigError, match="hidden_act"):
        ModelConfig.from_hf_dict({**TINY_MAMBA, "hidden_act": "gelu"})


def test_a_forward_without_state_slots_is_refused(mamba_dir: Path) -> None:
    model = load_model(mamba_dir)
    caches = model.kv_cache_spec.allocate(1, 16, 2, torch.float32, "cpu")
    md = _md([3], [0])
    no_slots = AttentionMetadata(**{**md.__dict__, "state_indices": None})
    with pytest.raises(ValueError, match="state_indices"):
        model(torch.tensor([5, 6, 7]), torch.arange(3), caches, no_slots)
    with pytest.raises(ValueError, match="Mamba state caches"):
        model(torch.tensor([5, 6, 7]), torch.arange(3), [torch.zeros(1)], md)
    assert all(isinstance(c, MambaState) for c in caches)
