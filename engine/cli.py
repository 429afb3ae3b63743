"""``turnout generate``, ``embed``, ``classify`` and ``score``: the ``LLM`` facade on the
command line.

Registered through the ``turnout.cli`` entry-point group; everything heavy (the engine, the
oracle, torch) is imported inside the command bodies so that other commands stay fast. The
runner decision is printed first (``--json``: one object with ``decision``, the oracle's JSON,
and ``outputs``). Exit codes follow ``turnout decide``: 2 bad input, 3 a pin or a deployment
no runner can serve.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any

import typer

EXIT_BAD_INPUT = 2
EXIT_NO_RUNNER = 3
# Top-level modules of the ``runners`` extra (pyproject.toml): without them the engine cannot
# load, and the command says how to install them instead of printing a traceback.
RUNNER_MODULES = frozenset(
    {"torch", "triton", "numpy", "safetensors", "gguf", "tokenizers", "jinja2"}
)
INSTALL_RUNNERS = "make install-runners (or: pip install -e '.[runners]')"

ModelOpt = Annotated[
    Path, typer.Option("--model", help="HF model directory or .gguf file", show_default=False)
]
RunnerOpt = Annotated[
    str, typer.Option("--runner", help="auto (the oracle decides), v1 or v2 (a pin)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object: decision and outputs")]
PackOpt = Annotated[str, typer.Option("--pack", help="policy pack name or folder")]
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="cpu or cuda (default: cuda when available)")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16")]
MaxLenOpt = Annotated[
    int | None, typer.Option("--max-model-len", help="tokens per request (default: the model's)")
]
TokOpt = Annotated[
    Path | None, typer.Option("--tokenizer", help="read the tokenizer from here (default: --model)")
]


def register_generate(app: typer.Typer) -> None:
    """Entry point of ``turnout generate``."""
    app.command(name="generate")(generate)


def register_embed(app: typer.Typer) -> None:
    """Entry point of ``turnout embed``."""
    app.command(name="embed")(embed)


def register_classify(app: typer.Typer) -> None:
    """Entry point of ``turnout classify``."""
    app.command(name="classify")(classify)


def register_score(app: typer.Typer) -> None:
    """Entry point of ``turnout score``."""
    app.command(name="score")(score)


def generate(
    model: ModelOpt,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="a prompt (repeatable)")
    ] = None,
    prompts: Annotated[
        Path | None, typer.Option("--prompts", help="a file with one prompt per line")
    ] = None,
    runner: RunnerOpt = "auto",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="output tokens at most")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="0 is greedy")] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="-1: all tokens")] = -1,
    min_p: Annotated[
        float, typer.Option("--min-p", help="drop tokens below min_p x the top probability")
    ] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    logprobs: Annotated[
        int | None, typer.Option("--logprobs", help="top-k logprobs per token")
    ] = None,
    chat: Annotated[
        bool,
        typer.Option(
            "--chat/--no-chat", help="apply the model's chat template (default: when it has one)"
        ),
    ] = True,
    speculative_config: Annotated[
        str | None,
        typer.Option(
            "--speculative-config",
            help='JSON, e.g. {"method": "ngram", "num_speculative_tokens": 3}',
        ),
    ] = None,
    cpu_offload_gb: Annotated[
        float, typer.Option("--cpu-offload-gb", help="GiB of weights kept in host memory")
    ] = 0.0,
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size",
            "-tp",
            help="ranks to split the model over, one process each (Llama family; docs/tensor-parallel.md)",
        ),
    ] = 1,
    max_model_len: MaxLenOpt = None,
    tokenizer: TokOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "float32",
    pack: PackOpt = "turnout",
    as_json: JsonOpt = False,
) -> None:
    """Generate text with the runner the oracle chooses; the decision is printed first."""
    texts = _read_inputs(prompt, prompts, "--prompt", "--prompts")
    spec = _parse_json_flag("--speculative-config", speculative_config)

    timing: dict[str, float] = {}

    def work() -> tuple[Any, list[dict[str, Any]]]:
        from turnout.engine.sampling_params import SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            seed=seed,
            logprobs=logprobs,
        )
        started = time.perf_counter()
        llm = _make_llm(
            model,
            runner,
            pack,
            device,
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            dtype=dtype,
            speculative_config=spec,
            cpu_offload_gb=cpu_offload_gb,
            tensor_parallel_size=tensor_parallel_size,
        )
        timing["load_s"] = time.perf_counter() - started
        _print_decision(llm, as_json)
        use_chat = chat and llm.tokenizer is not None and llm.tokenizer.chat_template is not None
        started = time.perf_counter()
        results = (
            llm.chat([[{"role": "user", "content": t}] for t in texts], params)
            if use_chat
            else llm.generate(texts, params)
        )
        timing["generate_s"] = time.perf_counter() - started
        return llm, [_completion_json(text, r) for text, r in zip(texts, results, strict=True)]

    llm, outputs = _run_guarded("generate", work)
    _print_outputs(llm, outputs, as_json, field="text", timing=generate_timing(timing, outputs))


def generate_timing(
    timing: dict[str, float], outputs: list[dict[str, Any]]
) -> dict[str, float | int]:
    """Wall-clock figures of one ``turnout generate``: ``load_s`` (deciding, reading the model
    and tokenizer, sizing the KV cache), ``generate_s`` (prefill and decode of every prompt),
    ``num_output_tokens`` and ``output_tokens_per_s`` (over ``generate_s``, to four significant
    digits: two decimals lost 1 % of a slow CPU run's 0.4846 tok/s)."""
    num_tokens = sum(len(out["token_ids"]) for out in outputs)
    generate_s = timing["generate_s"]
    return {
        "load_s": round(timing["load_s"], 3),
        "generate_s": round(generate_s, 3),
        "num_output_tokens": num_tokens,
        "output_tokens_per_s": float(f"{num_tokens / generate_s:.4g}") if generate_s > 0 else 0.0,
    }


def embed(
    model: ModelOpt,
    text: Annotated[
        list[str] | None, typer.Option("--text", help="a text to embed (repeatable)")
    ] = None,
    texts: Annotated[
        Path | None, typer.Option("--texts", help="a file with one text per line")
    ] = None,
    runner: RunnerOpt = "auto",
    tokenizer: TokOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "float32",
    pack: PackOpt = "turnout",
    as_json: JsonOpt = False,
) -> None:
    """Embed texts (mean pooling, L2-normalised) with the runner the oracle chooses."""
    items = _read_inputs(text, texts, "--text", "--texts")

    def work() -> tuple[Any, list[dict[str, Any]]]:
        llm = _make_llm(model, runner, pack, device, tokenizer=tokenizer, dtype=dtype)
        _print_decision(llm, as_json)
        results = llm.embed(items)
        return llm, [
            {"text": t, "embedding": r.embedding, "error": r.error}
            for t, r in zip(items, results, strict=True)
        ]

    llm, outputs = _run_guarded("embed", work)
    _print_outputs(llm, outputs, as_json, field="embedding")


def classify(
    model: ModelOpt,
    text: Annotated[
        list[str] | None, typer.Option("--text", help="a text to classify (repeatable)")
    ] = None,
    texts: Annotated[
        Path | None, typer.Option("--texts", help="a file with one text per line")
    ] = None,
    runner: RunnerOpt = "auto",
    max_model_len: MaxLenOpt = None,
    tokenizer: TokOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "float32",
    pack: PackOpt = "turnout",
    as_json: JsonOpt = False,
) -> None:
    """Classify texts with a sequence classifier or reward model: logits and probabilities
    (softmax; sigmoid for one label) per text."""
    items = _read_inputs(text, texts, "--text", "--texts")

    def work() -> tuple[Any, list[dict[str, Any]]]:
        llm = _make_llm(
            model,
            runner,
            pack,
            device,
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            dtype=dtype,
        )
        _print_decision(llm, as_json)
        results = llm.classify(items)  # refuses a model without a classifier first
        labels = llm.model_config.classifier.labels
        return llm, [
            {
                "text": t,
                "label": _top_label(labels, r.probs),
                "logits": r.logits,
                "probs": r.probs,
                "error": r.error,
            }
            for t, r in zip(items, results, strict=True)
        ]

    llm, outputs = _run_guarded("classify", work)
    _print_outputs(llm, outputs, as_json, field="logits")


def score(
    model: ModelOpt,
    query: Annotated[
        str,
        typer.Option(
            "--query", help="the query every document is scored against", show_default=False
        ),
    ],
    document: Annotated[
        list[str] | None, typer.Option("--document", help="a document (repeatable)")
    ] = None,
    documents: Annotated[
        Path | None, typer.Option("--documents", help="a file with one document per line")
    ] = None,
    rerank: Annotated[
        bool, typer.Option("--rerank", help="print the documents most relevant first")
    ] = False,
    top_n: Annotated[
        int | None, typer.Option("--top-n", help="with --rerank: the best N only")
    ] = None,
    runner: RunnerOpt = "auto",
    max_model_len: MaxLenOpt = None,
    tokenizer: TokOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "float32",
    pack: PackOpt = "turnout",
    as_json: JsonOpt = False,
) -> None:
    """Score (query, document) pairs with a cross-encoder; ``--rerank`` orders them."""
    items = _read_inputs(document, documents, "--document", "--documents")
    if top_n is not None and not rerank:
        _fail("--top-n needs --rerank")
    if top_n is not None and top_n < 1:  # before the model is loaded
        _fail(f"--top-n must be >= 1, got {top_n}")

    def work() -> tuple[Any, list[dict[str, Any]]]:
        llm = _make_llm(
            model,
            runner,
            pack,
            device,
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            dtype=dtype,
        )
        _print_decision(llm, as_json)
        if rerank:
            ranked = llm.rerank(query, items, top_n=top_n)
            return llm, [
                {
                    "index": r.index,
                    "document": r.document,
                    "score": r.relevance_score,
                    "error": r.error,
                }
                for r in ranked
            ]
        results = llm.score(query, items)
        return llm, [
            {"index": i, "document": d, "score": r.score, "error": r.error}
            for i, (d, r) in enumerate(zip(items, results, strict=True))
        ]

    llm, outputs = _run_guarded("score", work)
    _print_outputs(llm, outputs, as_json, field="score")


# ---- helpers ---------------------------------------------------------------------------
def _read_inputs(
    inline: list[str] | None, path: Path | None, inline_flag: str, file_flag: str
) -> list[str]:
    if bool(inline) == (path is not None):
        _fail(f"give {inline_flag} TEXT (repeatable) or {file_flag} FILE, exactly one of them")
    if path is None:
        return list(inline or [])
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        _fail(f"{file_flag} {path}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        _fail(f"{file_flag} {path}: not UTF-8 text (byte {exc.start})")
    if not lines:
        _fail(f"{file_flag} {path}: no non-empty line")
    return lines


def _parse_json_flag(flag: str, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        _fail(f"{flag}: invalid JSON at column {exc.colno}: {exc.msg}")


def _make_llm(
    model: Path,
    runner: str,
    pack: str,
    device: str | None,
    tokenizer: Path | None,
    **engine_args: Any,
) -> Any:
    from turnout.engine.llm import LLM

    # The decision is printed by the command; keep the engine's log lines off the terminal.
    engine_logger = logging.getLogger("turnout.engine")
    engine_logger.propagate = False
    engine_logger.addHandler(logging.NullHandler())  # else the last-resort handler prints warnings
    args = {k: v for k, v in engine_args.items() if v is not None}
    return LLM(model, runner, pack=pack, device=device, tokenizer=tokenizer, **args)


def _run_guarded(command: str, work: Any) -> Any:
    from turnout.engine.errors import EngineError, NoRunnerError
    from turnout.oracle.errors import OracleError

    try:
        llm, outputs = work()
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in RUNNER_MODULES:
            raise  # not a missing extra: a real error, with its traceback
        _fail(
            f"turnout {command} needs the runners extra, and {missing} cannot be imported "
            f"({exc}): install it with {INSTALL_RUNNERS}"
        )
    except NoRunnerError as exc:
        _fail(str(exc), EXIT_NO_RUNNER)
    except (EngineError, OracleError, ValueError) as exc:  # bad flags, files, packs
        _fail(str(exc))
    except OSError as exc:  # an unreadable model or tokenizer path
        _fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
    llm.shutdown()  # the run ends cleanly: its last health report goes to the service (if any)
    return llm, outputs


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> Any:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _print_decision(llm: Any, as_json: bool) -> None:
    if as_json:
        return
    d = llm.decision
    typer.echo(
        f"runner: {d.runner} ({d.mode}, {d.reason_code}; pack {d.pack}, policy {d.policy_digest})"
    )
    for message in d.messages:
        typer.echo(f"  {message.level}: {message.message}")


def _top_label(labels: tuple[str, ...], probs: list[float] | None) -> str | None:
    """The most probable label's name (HF ``id2label``), or None without probabilities."""
    return None if not probs else labels[max(range(len(probs)), key=probs.__getitem__)]


def _completion_json(prompt: str, result: Any) -> dict[str, Any]:
    completion = result.outputs[0]
    out: dict[str, Any] = {
        "prompt": prompt,
        "text": completion.text,
        "token_ids": completion.token_ids,
        "finish_reason": completion.finish_reason,
    }
    if completion.logprobs is not None:
        lps = completion.logprobs
        out["logprobs"] = [
            {str(tok): round(lp.logprob, 6) for tok, lp in lps.position(i).items()}
            for i in range(len(lps))
        ]
    if result.spec_decode is not None:  # speculative decoding: drafts verified and accepted
        out["spec_decode"] = result.spec_decode.as_dict()
    if result.error:
        out["error"] = result.error
    return out


def _print_outputs(
    llm: Any,
    outputs: list[dict[str, Any]],
    as_json: bool,
    *,
    field: str,
    timing: dict[str, float | int] | None = None,
) -> None:
    failed = sum(1 for out in outputs if out.get("error"))
    if as_json:
        body: dict[str, Any] = {"decision": llm.decision.to_json(), "outputs": outputs}
        typer.echo(json.dumps(body | ({"timing": timing} if timing else {})))
    for out in [] if as_json else outputs:
        source = out.get("prompt", out.get("text", out.get("document")))
        if field == "score":
            source = f"[{out['index']}] {source}"
        if out.get("error"):
            typer.echo(f"\n>>> {source}\nerror: {out['error']}")
        elif field == "text":
            spec = out.get("spec_decode")
            drafts = (
                f", {spec['num_accepted_tokens']} of {spec['num_draft_tokens']} drafts accepted"
                if spec
                else ""
            )
            typer.echo(
                f"\n>>> {source}\n{out['text']}\n[{len(out['token_ids'])} tokens, "
                f"finish_reason={out['finish_reason']}{drafts}]"
            )
        elif field == "logits":
            values = ", ".join(f"{x:.4f}" for x in out["logits"])
            probs = ", ".join(f"{x:.4f}" for x in out["probs"])
            typer.echo(f"\n>>> {source}\nlabel {out['label']}; logits [{values}]; probs [{probs}]")
        elif field == "score":
            typer.echo(f"\n>>> {source}\nscore {out['score']:.6f}")
        else:
            vec = out["embedding"]
            head = ", ".join(f"{x:.4f}" for x in vec[:6])
            typer.echo(f"\n>>> {source}\n[{head}, ...] ({len(vec)} dimensions)")
    if timing and not as_json:
        typer.echo(
            f"\n[load {timing['load_s']:.2f} s; generate {timing['generate_s']:.2f} s: "
            f"{timing['num_output_tokens']} output tokens, {timing['output_tokens_per_s']:.1f} tok/s]"
        )
    if failed:  # the others were served; the exit code says that some were not
        raise typer.Exit(EXIT_BAD_INPUT)


__all__ = [
    "classify",
    "embed",
    "generate",
    "register_classify",
    "register_embed",
    "register_generate",
    "register_score",
    "score",
]
