"""An independent reference of docs/sampling.md: HF transformers computes the logits of the
whole sequence at every step (no KV cache, no batching), and the steps of the contract are
applied to them one by one in the plainest form."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turnout.engine.sampling_params import SamplingParams
from turnout.kernels.gumbel_noise import gumbel_noise_ref


def load_hf(path: Path) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@dataclass
class RefOutput:
    token_ids: list[int]
    logprobs: list[float]  # raw logprob of each sampled token
    finish_reason: str


def next_logits(hf: Any, tokens: list[int]) -> torch.Tensor:  # [vocab] float32
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def prompt_logprobs(hf: Any, prompt: list[int]) -> torch.Tensor:  # [len - 1] float32
    with torch.no_grad():
        lps = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    return lps[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]


def reference_generate(
    hf: Any, prompt: list[int], p: SamplingParams, eos: set[int], max_model_len: int
) -> RefOutput:
    out: list[int] = []
    lps: list[float] = []
    while True:
        raw = next_logits(hf, prompt + out)
        x = raw.clone()
        for fn in p.logits_processors:
            n_pos = len(
                [q for q in inspect.signature(fn).parameters.values() if q.default is q.empty]
            )
            x = fn(list(prompt), list(out), x) if n_pos >= 3 else fn(list(out), x)
        x = _penalise(x, prompt, out, p)
        if len(out) < p.min_tokens:
            for t in {*p.stop_token_ids, *(() if p.ignore_eos else eos)}:
                x[t] = float("-inf")
        tok = _choose(x, p, position=len(prompt) + len(out))
        out.append(tok)
        lps.append(float(raw.log_softmax(-1)[tok]))
        stops = (not p.ignore_eos and tok in eos) or tok in p.stop_token_ids
        if stops and len(out) >= p.min_tokens:
            return RefOutput(out, lps, "stop")
        if len(out) >= p.max_tokens or len(prompt) + len(out) >= max_model_len:
            return RefOutput(out, lps, "length")


def _penalise(
    x: torch.Tensor, prompt: list[int], out: list[int], p: SamplingParams
) -> torch.Tensor:
    for t in set(prompt) | set(out):
        if p.repetition_penalty != 1:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(out):
        x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    return x


def _choose(x: torch.Tensor, p: SamplingParams, position: int) -> int:
    if p.temperature < 1e-5:
        return int(x.argmax())
    x = x / p.temperature
    if p.top_k > 0 and p.top_k < x.numel():
        kth = x.sort(descending=True).values[p.top_k - 1]
        x = torch.where(x >= kth, x, torch.tensor(float("-inf")))
    if p.top_p < 1:
        probs = x.softmax(-1)
        mass, threshold = 0.0, 0.0
        for value in probs.sort(descending=True).values.tolist():
            threshold = value
            mass += value
            if mass >= p.top_p:
                break
        x = torch.where(probs >= threshold, x, torch.tensor(float("-inf")))
    assert p.seed is not None
    noise = gumbel_noise_ref(torch.tensor([p.seed]), torch.tensor([position]), x.numel())[0]
    return int((x + noise).argmax())
