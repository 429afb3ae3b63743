"""``turnout classify`` / ``turnout score``: a transformers-written cross-encoder (the published
ms-marco config, 2 layers) scored and classified from the command line equals transformers, the
output formats, and every bad input named with exit code 2."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "model"))
from minilm_path import minilm_dir
from pooling_models import hf_pooling_dir, load_hf_classifier
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.cli import register_classify, register_score
from turnout.engine.model import write_random_weights

transformers = pytest.importorskip("transformers")
pytest.importorskip("pydantic")  # the oracle
ROOT = Path(__file__).resolve().parents[2]
QUERY = "how many people live in berlin?"
DOCS = ["Berlin has a population of 3.7 million people.", "Paris is in France.", "people"]


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    # The commands as the entry points register them (pyproject.toml, checked below).
    app = typer.Typer()
    register_classify(app)
    register_score(app)
    return app


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_pooling_dir(tmp_path_factory, "cross-encoder")


def invoke(app: typer.Typer, *args: str):
    return CliRunner().invoke(app, list(args))


def _hf_scores(path: Path, docs: list[str]) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return load_hf_classifier(path)(
            **tok([QUERY] * len(docs), docs, padding=True, return_tensors="pt")
        ).logits[:, 0]


def test_the_entry_points_are_declared() -> None:
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "turnout.cli"
    ]
    assert entry_points["classify"] == "turnout.engine.cli:register_classify"
    assert entry_points["score"] == "turnout.engine.cli:register_score"


def test_score_json_equals_transformers(
    app: typer.Typer, cross_encoder: Path, tmp_path: Path
) -> None:
    docs_file = tmp_path / "docs.txt"
    docs_file.write_text("\n".join(DOCS) + "\n\n")
    res = invoke(
        app,
        "score",
        "--model",
        str(cross_encoder),
        "--query",
        QUERY,
        "--documents",
        str(docs_file),
        "--json",
    )
    assert res.exit_code == 0, res.output
    result = json.loads(res.output)
    assert result["decision"]["runner"] == "v1"
    assert [o["document"] for o in result["outputs"]] == DOCS and [
        o["index"] for o in result["outputs"]
    ] == [0, 1, 2]
    want = _hf_scores(cross_encoder, DOCS)
    torch.testing.assert_close(
        torch.tensor([o["score"] for o in result["outputs"]]), want, atol=1e-4, rtol=0
    )
    args = [
        "score",
        "--model",
        str(cross_encoder),
        "--query",
        QUERY,
        "--json",
        "--rerank",
        "--top-n",
        "2",
    ]
    for d in DOCS:
        args += ["--document", d]
    ranked = json.loads(invoke(app, *args).output)["outputs"]
    assert [o["index"] for o in ranked] == sorted(range(3), key=lambda i: -want[i].item())[:2]


def test_score_text_output_and_a_pair_too_long(app: typer.Typer, cross_encoder: Path) -> None:
    res = invoke(
        app,
        "score",
        "--model",
        str(cross_encoder),
        "--query",
        QUERY,
        "--document",
        DOCS[0],
        "--document",
        "berlin " * 40,
        "--max-model-len",
        "32",
        "--runner",
        "v2",
    )
    assert res.exit_code == 2, res.output  # one document was not scored: exit 2, the other printed
    lines = res.output.splitlines()
    assert lines[0].startswith("runner: v2 (pinned")
    assert f">>> [0] {DOCS[0]}" in lines and any(line.startswith("score ") for line in lines)
    error = next(line for line in lines if line.startswith("error: "))
    assert "document 1: " in error and "more than max_model_len=32" in error


def test_classify_json_equals_transformers(app: typer.Typer, cross_encoder: Path) -> None:
    res = invoke(
        app,
        "classify",
        "--model",
        str(cross_encoder),
        "--text",
        DOCS[0],
        "--text",
        DOCS[1],
        "--json",
    )
    assert res.exit_code == 0, res.output
    outs = json.loads(res.output)["outputs"]
    tok = transformers.AutoTokenizer.from_pretrained(cross_encoder)
    with torch.no_grad():
        want = load_hf_classifier(cross_encoder)(
            **tok(DOCS[:2], padding=True, return_tensors="pt")
        ).logits
    torch.testing.assert_close(torch.tensor([o["logits"] for o in outs]), want, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        torch.tensor([o["probs"] for o in outs]), torch.sigmoid(want), atol=1e-5, rtol=0
    )
    assert [o["label"] for o in outs] == ["LABEL_0", "LABEL_0"] and outs[0]["text"] == DOCS[0]
    text = invoke(app, "classify", "--model", str(cross_encoder), "--text", DOCS[1]).output
    assert f">>> {DOCS[1]}" in text and "label LABEL_0; logits [" in text


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-pooling-llama")
    write_random_weights(TINY_DECODER_CONFIGS["llama"], path, dtype=torch.float32, seed=1)
    return path


def test_bad_input_is_named(app: typer.Typer, cross_encoder: Path, llama_dir: Path) -> None:
    cases = [
        (
            ["score", "--model", str(llama_dir), "--query", "q", "--document", "d"],
            f"error: {llama_dir} is not a pooling model (LlamaForCausalLM generates text): it does not serve "
            "the 'score' task; use generate()",
        ),
        (
            ["classify", "--model", str(minilm_dir()), "--text", "x"],
            f"error: {minilm_dir()} (BertModel) does not serve the 'classify' task, which needs a sequence "
            "classifier (BertForSequenceClassification, LlamaForSequenceClassification); it serves: embed",
        ),
        (
            ["score", "--model", str(cross_encoder), "--query", "q"],
            "error: give --document TEXT (repeatable) or --documents FILE, exactly one of them",
        ),
        (
            [
                "score",
                "--model",
                str(cross_encoder),
                "--query",
                "q",
                "--document",
                "d",
                "--top-n",
                "1",
            ],
            "error: --top-n needs --rerank",
        ),
        (
            [
                "score",
                "--model",
                str(cross_encoder),
                "--query",
                "q",
                "--document",
                "d",
                "--rerank",
                "--top-n",
                "0",
            ],
            "error: --top-n must be >= 1, got 0",
        ),
        # checked before any model is loaded: a path that does not exist is never reached
        (
            [
                "score",
                "--model",
                "/no/such/model",
                "--query",
                "q",
                "--document",
                "d",
                "--rerank",
                "--top-n",
                "-1",
            ],
            "error: --top-n must be >= 1, got -1",
        ),
        (
            ["classify", "--model", str(cross_encoder)],
            "error: give --text TEXT (repeatable) or --texts FILE",
        ),
    ]
    for args, message in cases:
        res = invoke(app, *args)
        assert res.exit_code == 2, (args, res.output)
        assert message in " ".join(res.output.split()), res.output
