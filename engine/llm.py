"""``LLM``: the offline facade (vLLM's ``LLM`` shape). It reads the model's config, builds the
:class:`EngineConfig` and the oracle's ``DeploymentConfig`` from its arguments and this
machine, asks the oracle once, logs the decision, and builds the chosen runner by name. With a
rollout-control service (``oracle_client``, or ``TURNOUT_URL``: ``engine/reporting.py``) it
decides with the service's canaries, reports the decision, and reports its runtime health
(``engine/health.py``) until :meth:`LLM.close`."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from turnout.engine import llm_pooling
from turnout.engine.config import EngineConfig
from turnout.engine.errors import EngineConfigError, InvalidRequestError
from turnout.engine.llm_pooling import as_batch
from turnout.engine.model_info import engine_config_for, read_model_config
from turnout.engine.outputs import (
    ClassificationOutput,
    CompletionOutput,
    EmbeddingOutput,
    Logprobs,
    RequestOutput,
    RerankResult,
    RewardOutput,
    ScoringOutput,
)
from turnout.engine.reporting import Reporting, client_from_env, default_environ, deployment_id_from
from turnout.engine.request import Request, RequestStatus
from turnout.engine.runner_loader import build_engine_core
from turnout.engine.runner_selection import choose_runner, deployment_config
from turnout.engine.sampling_params import SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """Generate text, or run a pooling task (embed, classify, score / rerank, reward), with the
    runner the oracle chooses.

    Args:
        model: an HF safetensors directory or a ``.gguf`` file.
        runner: ``"auto"`` (the oracle decides; the pack's runner variable in the environment
            is honoured), ``"v1"`` or ``"v2"`` (a pin the oracle checks).
        tokenizer: where to read the tokenizer (default: ``model``, where none found means
            prompts must be token ids); a given path without a tokenizer is an error.
        device: ``"cpu"`` or ``"cuda"``; default CUDA when available.
        pack / canaries / deployment_id: the policy pack, canary snapshot and sticky id given
            to the oracle.
        logits_processors: processors requests of this deployment may use (declared so that
            the oracle knows; per-request ones go in ``SamplingParams.logits_processors``).
        oracle_client: an ``oracle.client.OracleClient`` of the same pack to decide with and
            report through (the caller closes it); default: one for ``TURNOUT_URL`` when set
            in ``environ`` (``engine/reporting.py``), else none (nothing reported).
        **engine_args: :class:`EngineConfig` fields (``max_model_len``, ``max_num_seqs``,
            ``max_num_batched_tokens``, ``block_size``, ``enable_chunked_prefill``,
            ``enable_prefix_caching``, ``max_logprobs``, ``num_kv_blocks``,
            ``kv_cache_memory_gb``, ``cpu_offload_gb``, ``speculative_config``, ``dtype``,
            ``seed``, ``tensor_parallel_size``: one process per rank, stopped by
            :meth:`shutdown`, docs/tensor-parallel.md).

    Raises:
        EngineConfigError: a bad argument, or a deployment/pin no runner can serve.
        FileNotFoundError, ModelConfigError: the model (or the given tokenizer) cannot be read.
    """

    def __init__(
        self,
        model: str | Path,
        runner: str = "auto",
        *,
        tokenizer: str | Path | None = None,
        device: str | None = None,
        pack: str | Path = "turnout",
        canaries: Any = None,
        deployment_id: str | None = None,
        logits_processors: Sequence[Callable[..., Any] | str] = (),
        environ: Mapping[str, str] | None = None,
        oracle_client: Any = None,
        **engine_args: Any,
    ) -> None:
        from turnout.oracle import load_pack

        model_config = read_model_config(model)
        self.model_config = model_config
        engine_args["device"] = device or _default_device()
        self.config: EngineConfig = engine_config_for(model, model_config, **engine_args)
        # Before the weights: a tokenizer that cannot be read fails fast.
        self.tokenizer = load_tokenizer_for(
            tokenizer if tokenizer is not None else model, explicit=tokenizer is not None
        )
        self.pack = load_pack(pack)
        env = default_environ(environ)
        deployment_id = deployment_id_from(env, deployment_id)
        self.deployment = deployment_config(
            self.config,
            model_config.architecture,
            runner=runner,
            pack=self.pack,
            logits_processors=logits_processors,
            deployment_id=deployment_id,
            environ=environ,
            quantization=model_config.quantization_method,
        )
        self._live: dict[str, Request] = {}
        self._next_id = 0
        reporting = self._reporting_for(oracle_client, env, str(pack))
        try:
            self.decision = choose_runner(
                self.deployment,
                pack=self.pack,
                canaries=canaries,
                client=reporting.client if reporting else None,
            )
            self.runner_name: str = self.decision.runner
            if reporting is not None:
                reporting.start_health(self.decision, deployment_id or reporting.client.host)
            self.core = build_engine_core(self.config, self.runner_name)
        except BaseException:
            if reporting is not None:
                reporting.end()
            raise
        self._reporting = reporting
        # A clean end whether or not close() is called: at close(), when the LLM is collected,
        # or at the interpreter's exit (only a process that dies leaves the run marked open).
        self._end = weakref.finalize(self, reporting.end) if reporting else None

    def _reporting_for(self, client: Any, env: Mapping[str, str], pack: str) -> Reporting | None:
        if client is None:
            made = client_from_env(env, pack)
            return None if made is None else Reporting(made, owns_client=True)
        if client.pack.digest != self.pack.digest:
            raise EngineConfigError(
                f"the oracle client runs pack {client.pack.name} "
                f"({client.pack.digest}), the engine {self.pack.name} "
                f"({self.pack.digest})"
            )
        return Reporting(client, owns_client=False)

    def close(self) -> None:
        """End reporting cleanly (the last health report, the run marked closed); the engine
        stays usable for generation but reports nothing more. Idempotent."""
        if self._end is not None:
            self._end()

    def shutdown(self) -> None:
        """:meth:`close`, and stop the engine's other processes (the worker ranks when
        ``tensor_parallel_size > 1``; they also stop when the LLM is collected or the
        interpreter exits). Idempotent; the engine cannot generate after it."""
        self.close()
        self.core.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.shutdown()

    # ---- generation --------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or a list of token ids); one output per prompt, in
        order. A prompt that cannot be served comes back with ``error`` set and
        ``finish_reason == "error"``; the others are unaffected."""
        if self.config.runner_kind != "generate":
            tasks = self.config.pooling_tasks
            raise EngineConfigError(
                f"{self.config.model} is a pooling model ({self.model_config.architecture}; "
                f"tasks: {', '.join(tasks)}): it does not generate; use {tasks[0]}()"
            )
        batch = as_batch(prompts)
        params = _per_prompt(sampling_params, len(batch))
        return self._run([(p, self._encode(p, add_special_tokens=True)) for p in batch], params)

    def chat(
        self,
        messages: Sequence[Mapping[str, str]] | Sequence[Sequence[Mapping[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations rendered with the model's chat template. A
        conversation the template rejects comes back with ``error`` set (``prompt`` is
        ``None``); the others are unaffected.

        Raises:
            TokenizerError: the model has no chat template.
            ImportError: jinja2, which renders chat templates, is not installed.
        """
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else messages
        from turnout.engine.model.tokenizer import TokenizerError

        tokenizer = self._tokenizer()
        if not tokenizer.chat_template:
            raise TokenizerError(f"{self.config.model} has no chat template; use generate()")
        encoded: list[tuple[Prompt | None, list[int] | InvalidRequestError]] = []
        for i, conversation in enumerate(conversations):
            try:
                text = tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True)
            except ImportError:
                raise  # jinja2 missing: the install's fault, not this conversation's
            except Exception as exc:  # jinja2 errors, or a TypeError from the template's own code
                encoded.append(
                    (
                        None,
                        InvalidRequestError(
                            f"conversation {i}: the chat template rejects it: {type(exc).__name__}: {exc}"
                        ),
                    )
                )
                continue
            # The rendered template already holds its special tokens.
            encoded.append((text, self._encode(text, add_special_tokens=False)))
        return self._run(encoded, _per_prompt(sampling_params, len(encoded)))

    # ---- pooling (engine/llm_pooling.py) ------------------------------------------------
    def embed(self, texts: Prompt | Sequence[Prompt]) -> list[EmbeddingOutput]:
        """L2-normalised mean-pooled embeddings (``[hidden_size]`` each), in order; a text that
        cannot be served comes back with ``error`` set.

        Raises:
            EngineConfigError: the model does not serve ``embed`` (the task and model named).
        """
        return llm_pooling.embed(self, texts)

    def classify(self, prompts: Prompt | Sequence[Prompt]) -> list[ClassificationOutput]:
        """Sequence-classification ``logits`` (``[num_labels]``) and ``probs`` (softmax;
        sigmoid for one label) of each prompt, in order; a prompt that cannot be served comes
        back with ``error`` set.

        Raises:
            EngineConfigError: the model does not serve ``classify``.
        """
        return llm_pooling.classify(self, prompts)

    def score(self, query: Prompt, documents: Prompt | Sequence[Prompt]) -> list[ScoringOutput]:
        """A cross-encoder's relevance score of ``(query, document)`` for each document, in
        order (text tokenized as a pair; token ids joined as given, the caller's special tokens
        included); a pair that cannot be served (longer than ``max_model_len``) comes back with
        ``error`` set while the others are scored.

        Raises:
            EngineConfigError: the model does not serve ``score``.
            InvalidRequestError: ``documents`` is empty.
        """
        return llm_pooling.score(self, query, documents)

    def rerank(
        self, query: Prompt, documents: Prompt | Sequence[Prompt], top_n: int | None = None
    ) -> list[RerankResult]:
        """``documents`` ordered by :meth:`score`, most relevant first (ties keep their
        order), each with its ``index`` and ``relevance_score``; the best ``top_n`` (all when
        ``None``), then every document that could not be scored, with its error.

        Raises:
            ValueError: ``top_n`` is not a positive int; and what :meth:`score` raises.
        """
        return llm_pooling.rerank(self, query, documents, top_n)

    def reward(self, prompts: Prompt | Sequence[Prompt]) -> list[RewardOutput]:
        """A reward model's head outputs (``[num_labels]``, no activation) at each prompt's
        last token, in order; a prompt that cannot be served comes back with ``error`` set.

        Raises:
            EngineConfigError: the model does not serve ``reward``.
        """
        return llm_pooling.reward(self, prompts)

    # ---- internals ---------------------------------------------------------------------
    def _run(
        self,
        encoded: list[tuple[Prompt | None, list[int] | InvalidRequestError]],
        params: list[SamplingParams],
    ) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        ids: list[str] = []
        with self._abort_all_on_failure():
            for (prompt, tokens), p in zip(encoded, params, strict=True):
                req_id = self._new_id()
                ids.append(req_id)
                try:
                    if isinstance(tokens, InvalidRequestError):
                        raise tokens
                    self._queue(req_id, list(tokens), p)
                except InvalidRequestError as exc:
                    results[req_id] = _rejected(req_id, prompt, tokens, str(exc))
            finished = self._run_until_done()
        for req in finished:
            results[req.req_id] = self._output(req)
        for req_id, (prompt, _) in zip(ids, encoded, strict=True):
            results[req_id].prompt = _text(prompt)
        return [results[i] for i in ids]

    def _output(self, req: Request) -> RequestOutput:
        params = req.sampling_params
        assert params is not None
        logprobs = (
            Logprobs.concat(req.logprobs, params.logprobs) if params.logprobs is not None else None
        )
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = Logprobs.concat(req.prompt_logprobs, params.prompt_logprobs)
        text = self.tokenizer.decode(req.output_token_ids) if self.tokenizer is not None else ""
        completion = CompletionOutput(
            list(req.output_token_ids), text, req.status.finish_reason, req.stop_reason, logprobs
        )
        spec = req.spec_decode if self.config.speculative_config is not None else None
        return RequestOutput(
            req.req_id,
            None,
            req.prompt_token_ids,
            [completion],
            prompt_lps,
            num_cached_tokens=max(0, req.num_cached_tokens),
            num_preemptions=req.num_preemptions,
            error=req.error,
            spec_decode=spec,
        )

    @contextlib.contextmanager
    def _abort_all_on_failure(self) -> Iterator[None]:
        # A call stopped part-way (Ctrl-C, an exception out of the runner) must not leave its
        # requests behind: the next call would find them mid-step, out of step with the runner.
        try:
            yield
        except BaseException:
            self.core.abort_all()
            self._live.clear()
            if self._recorder is not None:
                self._recorder.failed_all()
            raise

    @property
    def health_recorder(self) -> Any:
        """The :class:`~engine.health.HealthRecorder` reported to the service (``None`` when
        nothing is reported): a server driving :attr:`core` itself records into it."""
        return self._recorder

    @property
    def oracle_client(self) -> Any:
        """The ``oracle.client.OracleClient`` this engine reports through (``None`` when it
        reports nothing): a server registers its address with it."""
        return self._reporting.client if self._reporting is not None else None

    @property
    def _recorder(self) -> Any:
        return self._reporting.recorder if self._reporting is not None else None

    def _queue(
        self, req_id: str, tokens: list[int], params: SamplingParams | None = None, **pooling: Any
    ) -> None:
        """``core.add_request``, and the request timed when health is reported."""
        request = self.core.add_request(req_id, tokens, params, **pooling)
        if self._recorder is not None:
            self._live[req_id] = request
            self._recorder.queued(req_id)

    def _run_until_done(self) -> list[Request]:
        """``core.run_until_done``, observed by the health recorder after each step."""
        recorder = self._recorder
        if recorder is None:
            return self.core.run_until_done()
        done: list[Request] = []
        with recorder.running():
            while self.core.has_unfinished_requests():
                finished = self.core.step()
                recorder.observe((i, len(r.output_token_ids)) for i, r in self._live.items())
                for req in finished:
                    self._live.pop(req.req_id, None)
                    recorder.finished(req.req_id, failed=req.status is RequestStatus.FINISHED_ERROR)
                done.extend(finished)
        return done

    def _encode(
        self, prompt: Prompt, *, add_special_tokens: bool
    ) -> list[int] | InvalidRequestError:
        if not isinstance(prompt, str):
            try:
                return list(prompt)
            except TypeError:  # a batch item that is neither text nor a sequence of ids
                return InvalidRequestError(
                    f"a prompt is text or a list of token ids, got {prompt!r}"
                )
        if self.tokenizer is None:
            return InvalidRequestError(
                f"{self.config.model} has no tokenizer: pass token ids instead of text"
            )
        ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        return ids

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise EngineConfigError(f"{self.config.model} has no tokenizer")
        return self.tokenizer

    def _new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id - 1)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer_for(source: str | Path, *, explicit: bool) -> Any:
    """The tokenizer at ``source``, or ``None`` where a model directory has none (prompts are
    then token ids).

    Raises:
        FileNotFoundError: ``explicit`` (``--tokenizer`` / ``tokenizer=`` given) and it cannot
            be read.
    """
    from turnout.engine.model.tokenizer import load_tokenizer

    if explicit and not Path(source).exists():
        raise FileNotFoundError(f"tokenizer {source}: no such file or directory")
    try:
        return load_tokenizer(source)
    except FileNotFoundError as exc:
        if explicit:  # asked for: never dropped silently
            raise FileNotFoundError(f"tokenizer {source}: {exc}") from exc
        return None  # e.g. random-weight directories: prompts are token ids


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    items = list(params)
    if len(items) != n:
        raise ValueError(f"{len(items)} sampling params for {n} prompts")
    return items


def _text(prompt: Prompt | None) -> str | None:
    return prompt if isinstance(prompt, str) else None


def _rejected(req_id: str, prompt: Prompt | None, tokens: Any, error: str) -> RequestOutput:
    ids = list(tokens) if isinstance(tokens, list) else []
    return RequestOutput(
        req_id, _text(prompt), ids, [CompletionOutput([], "", "error")], error=error
    )


__all__ = ["LLM", "load_tokenizer_for"]
