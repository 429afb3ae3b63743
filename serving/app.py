"""The HTTP face of ``turnout engine serve``: OpenAI's endpoints in vLLM's shapes.

| route | what |
|---|---|
| ``GET /v1/models`` | the served model, with ``max_model_len`` and the runner decision (``turnout``) |
| ``POST /v1/completions`` | text completion; ``stream`` gives SSE ``data:`` chunks and ``data: [DONE]`` |
| ``POST /v1/chat/completions`` | chat, rendered with the tokenizer's chat template |
| ``POST /v1/embeddings`` | pooling models (``embed``) |
| ``GET /health`` | liveness: 200 while the engine thread runs (draining included) |
| ``GET /ready`` | readiness: 200 once loaded, 503 while loading and while draining |
| ``GET /version`` | turnout's version and the runner |
| ``GET /metrics`` | Prometheus text, vLLM's names (``turnout.serving.metrics``) |

Every answer carries ``x-turnout-runner``. Errors use OpenAI's shape (``protocol.error_body``):
400 for a body that is not valid JSON, a field of the wrong type or range, a prompt plus
``max_tokens`` over the context, or a field turnout does not implement; 404 for a model this
server does not serve (vLLM's answer); 401 without the ``--api-key``; 413 for a body over
``MAX_BODY_BYTES``; 503 with ``Retry-After`` while loading, while draining, or when the waiting
queue is at ``--max-num-queued-reqs``. A bad request is refused alone: the engine never sees
it, and a request the engine refuses at admission fails only itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnout.engine.errors import InvalidRequestError
from turnout.engine.outputs import Logprobs
from turnout.engine.pooling_params import PoolingParams
from turnout.engine.sampling_params import SamplingParams
from turnout.serving.async_engine import AsyncEngine, Delta, EngineDeadError
from turnout.serving.detokenize import token_text
from turnout.serving.protocol import (
    ERROR_TYPES,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    error_body,
)
from turnout.serving.startup import EngineInfo

logger = logging.getLogger("turnout.serving")

MAX_BODY_BYTES = 16 * 1024 * 1024
# Sequences one HTTP request may add (prompts x n): one body cannot queue unbounded work.
MAX_SEQUENCES_PER_REQUEST = 256
RETRY_AFTER_S = 1
# vLLM writes -inf logprobs as -9999.0 (JSON has no infinities).
_NEG_INF_LOGPROB = -9999.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class HTTPError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, retry_after: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = (
            status,
            message,
            param,
            retry_after,
        )

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.retry_after else None
        body = error_body(
            self.message,
            self.status,
            err_type=ERROR_TYPES.get(self.status, "Error"),
            param=self.param,
        )
        return JSONResponse(body, status_code=self.status, headers=headers)


@dataclass
class ServerState:
    """What the routes read; set by ``turnout.serving.server`` as the model loads.

    Attributes:
        served_model_names: the names clients use (the first is the metrics' ``model_name``).
        runner_header: the ``x-turnout-runner`` value (``v1``, ``v2``; ``loading`` before).
        api_keys: accepted bearer tokens (empty: no authentication).
    """

    served_model_names: list[str]
    api_keys: frozenset[str] = frozenset()
    runner_header: str = "loading"
    engine: AsyncEngine | None = None
    info: EngineInfo | None = None
    tokenizer: Any = None
    metrics: Any = None
    decision: dict[str, Any] | None = None
    engine_id: str | None = None  # as registered with the service (None: not reported)
    model_path: str = ""
    max_model_len: int = 0
    version: str = ""
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    num_in_flight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    idle: asyncio.Event | None = None


class ServingMiddleware:
    """Pure ASGI: the runner header, the API key, drain and load refusals, and the count of
    requests in flight (a streamed answer counts until its last byte)."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.state

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-turnout-runner", state.runner_header.encode()))
                message["headers"] = headers
            await send(message)

        path: str = scope.get("path", "")
        if not path.startswith("/v1/"):
            await self.app(scope, receive, send_with_header)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal.response()(scope, receive, send_with_header)
            return
        state.num_in_flight += 1
        if state.idle is not None:
            state.idle.clear()
        try:
            await self.app(scope, receive, send_with_header)
        finally:
            state.num_in_flight -= 1
            if state.num_in_flight == 0 and state.idle is not None:
                state.idle.set()

    def _refusal(self, scope: Scope) -> HTTPError | None:
        state = self.state
        if state.api_keys:
            auth = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or token.strip() not in state.api_keys:
                return HTTPError(
                    401, "Unauthorized: a valid API key is required (Authorization: Bearer ...)"
                )
        if state.draining:
            return HTTPError(503, "the server is draining (shutting down)", retry_after=True)
        if state.load_error is not None:
            return HTTPError(503, f"the model failed to load: {state.load_error}")
        if not state.ready:
            return HTTPError(503, "the model is loading", retry_after=True)
        return None


async def _read_json(request: Request) -> Any:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise HTTPError(413, f"the body is over {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise HTTPError(413, f"the body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:
        raise HTTPError(400, f"the body is not valid JSON: {exc}") from None
    try:  # a lone surrogate escape ("\\ud800") is valid JSON but no Unicode text
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPError(
            400, "the body holds a lone surrogate escape: it is not Unicode text"
        ) from None
    except RecursionError:
        raise HTTPError(400, "the body is nested too deeply") from None
    return body


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise HTTPError(400, "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise HTTPError(
            400, f"{param}: {err['msg']}" if param else err["msg"], param=param
        ) from None
    except RecursionError:
        raise HTTPError(400, "the body is nested too deeply") from None


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI application over ``state`` (routes above)."""
    app = FastAPI(title="turnout engine serve", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPError)
    async def _http_error(_request: Request, exc: HTTPError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return HTTPError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_request: Request, exc: EngineDeadError) -> JSONResponse:
        return HTTPError(500, str(exc)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error")
        return HTTPError(500, f"internal error: {type(exc).__name__}").response()

    @app.get("/health")
    async def health() -> Response:
        engine = state.engine
        if state.load_error is not None or (engine is not None and engine.failed is not None):
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        engine = state.engine
        failed = engine is not None and engine.failed is not None
        is_ready = state.ready and not state.draining and not failed
        body = {
            "ready": is_ready,
            "draining": state.draining,
            "loading": not state.ready,
            "failed": failed,
        }
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": state.version, "runner": state.runner_header}

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return PlainTextResponse("", media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "turnout",
                    "root": state.model_path,
                    "parent": None,
                    "max_model_len": state.max_model_len,
                    "turnout": {"runner": state.runner_header, "decision": state.decision},
                }
                for name in state.served_model_names
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await _read_json(request))
        # Tokenizing (a prompt may be megabytes) runs beside the event loop, not on it.
        handler = await asyncio.to_thread(_Generation, state, body, chat=False)
        return await handler.respond(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await _read_json(request))
        handler = await asyncio.to_thread(_Generation, state, body, chat=True)
        return await handler.respond(request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = _parse(EmbeddingRequest, await _read_json(request))
        return await _embed(state, body, request)

    app.add_middleware(ServingMiddleware, state=state)
    return app


def _check_model(state: ServerState, model: str | None) -> str:
    if model is None:
        return state.served_model_names[0]
    if model not in state.served_model_names:
        raise HTTPError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _engine(state: ServerState, num_sequences: int) -> AsyncEngine:
    """The engine, if it can queue ``num_sequences`` more requests (else 503)."""
    engine = state.engine
    assert engine is not None
    if engine.would_exceed_queue_bound(num_sequences):
        state.metrics.admission_rejections["max_num_queued_reqs"].inc()
        raise HTTPError(
            503,
            f"the waiting queue cannot take {num_sequences} more request(s) (at most "
            f"{engine.max_num_queued_reqs}, --max-num-queued-reqs); retry later",
            retry_after=True,
        )
    return engine


class _Generation:
    """One completions or chat request: its prompts, its choices, its answer."""

    def __init__(
        self, state: ServerState, body: CompletionRequest | ChatCompletionRequest, *, chat: bool
    ) -> None:
        self.state, self.body, self.chat = state, body, chat
        self.model = _check_model(state, body.model)
        unsupported = body.unsupported()
        if unsupported is not None:
            raise HTTPError(
                400, f"{unsupported} is not supported by turnout's runners", param=unsupported
            )
        info = state.info
        assert info is not None  # the middleware answers 503 until the engine is in
        if info.runner_kind != "generate":
            raise HTTPError(
                400, f"{self.model} is a pooling model: use /v1/embeddings", param="model"
            )
        self.tokenizer = state.tokenizer
        self.created = int(time.time())
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.prompts = self._prompts()
        self.num_logprobs = self._num_logprobs()

    def _prompts(self) -> list[list[int]]:
        body = self.body
        if isinstance(body, ChatCompletionRequest):
            if self.tokenizer is None or not self.tokenizer.chat_template:
                raise HTTPError(
                    400, f"{self.model} has no chat template: use /v1/completions", param="messages"
                )
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=body.add_generation_prompt
                )
            except Exception as exc:  # jinja2's errors, or the template's raise_exception
                raise HTTPError(
                    400, f"the chat template rejects the messages: {exc}", param="messages"
                ) from None
            return [self.tokenizer.encode(text, add_special_tokens=False)]
        prompt = body.prompt
        if isinstance(prompt, str):
            items: list[str | list[int]] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            items = [prompt]  # type: ignore[list-item]  # one prompt of token ids
        else:
            items = list(prompt)  # type: ignore[arg-type]
        if not items:
            raise HTTPError(400, "prompt: no prompt given", param="prompt")
        out: list[list[int]] = []
        for item in items:
            if isinstance(item, str):
                if self.tokenizer is None:
                    raise HTTPError(
                        400, f"{self.model} has no tokenizer: send token ids", param="prompt"
                    )
                out.append(self.tokenizer.encode(item, add_special_tokens=True))
            else:
                out.append(list(item))
        return out

    def _num_logprobs(self) -> int | None:
        body = self.body
        if isinstance(body, ChatCompletionRequest):
            if body.top_logprobs is not None and not body.logprobs:
                raise HTTPError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
            return (body.top_logprobs or 0) if body.logprobs else None
        return body.logprobs

    def _max_tokens(self, prompt: list[int]) -> int:
        body = self.body
        max_len = self.state.max_model_len
        asked = body.max_tokens
        if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
            asked = body.max_completion_tokens
        if asked is None:
            left = max_len - len(prompt)
            if left < 1:
                raise HTTPError(
                    400,
                    f"This model's maximum context length is {max_len} tokens. However, your "
                    f"request has {len(prompt)} input tokens. Please reduce the length of the input.",
                    param="messages" if self.chat else "prompt",
                )
            return left
        if len(prompt) + asked > max_len:
            raise HTTPError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you "
                f"requested {len(prompt) + asked} tokens ({len(prompt)} in the "
                f"{'messages' if self.chat else 'prompt'}, {asked} in the completion). Please "
                "reduce the length of the input or of max_tokens.",
                param="max_tokens",
            )
        return asked

    def _params(self, prompt: list[int], index: int) -> SamplingParams:
        body = self.body
        seed = None if body.seed is None else (body.seed + index) % 2**63
        try:
            return SamplingParams(
                max_tokens=self._max_tokens(prompt),
                min_tokens=body.min_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=-1 if body.top_k is None else body.top_k,
                min_p=body.min_p,
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                repetition_penalty=body.repetition_penalty,
                seed=seed,
                stop_token_ids=tuple(body.stop_token_ids),
                ignore_eos=body.ignore_eos,
                logprobs=self.num_logprobs,
            )
        except InvalidRequestError as exc:
            raise HTTPError(400, str(exc)) from None

    async def respond(self, request: Request) -> Response:
        body = self.body
        # Choices in OpenAI's order: prompt by prompt, n per prompt (seed + i for the i-th).
        plan = [(p, i) for p in range(len(self.prompts)) for i in range(body.n)]
        if len(plan) > MAX_SEQUENCES_PER_REQUEST:
            raise HTTPError(
                400,
                f"{len(self.prompts)} prompt(s) x n={body.n} is {len(plan)} sequences; at most "
                f"{MAX_SEQUENCES_PER_REQUEST} per request",
                param="n",
            )
        engine = _engine(self.state, len(plan))
        arrival = time.monotonic()
        params = [self._params(self.prompts[p], i) for p, i in plan]
        streams = [
            engine.prepare(
                engine.new_request_id(self.id),
                self.prompts[p],
                sp,
                stop=body.stop_strings(),
                include_stop_str_in_output=body.include_stop_str_in_output,
                arrival=arrival,
                n=body.n,
            )
            for (p, _), sp in zip(plan, params, strict=True)
        ]
        try:
            await engine.submit_all(streams)
        except InvalidRequestError as exc:
            raise HTTPError(400, str(exc)) from None
        if body.stream:
            return StreamingResponse(
                self._sse(engine, streams),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await _until_disconnect(request, self._whole(engine, streams), engine, streams)

    # -- whole answers --------------------------------------------------------------------
    async def _whole(self, engine: AsyncEngine, streams: list[Any]) -> JSONResponse:
        async def gather(stream: Any) -> list[Delta]:
            return [d async for d in engine.deltas(stream)]

        results = await asyncio.gather(*(gather(s) for s in streams))
        choices = []
        completion_tokens = 0
        for index, deltas in enumerate(results):
            last = deltas[-1]
            if last.finish_reason == "error":
                raise HTTPError(500, last.error or "the engine failed the request")
            text = "".join(d.text for d in deltas)
            token_ids = [t for d in deltas for t in d.token_ids]
            completion_tokens += len(token_ids)
            logprobs = None
            if self.num_logprobs is not None:
                lps = Logprobs.concat(
                    [d.logprobs for d in deltas if d.logprobs is not None], self.num_logprobs
                )
                logprobs = self._logprobs(lps, 0)
            choice: dict[str, Any] = {"index": index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice.update(
                logprobs=logprobs, finish_reason=last.finish_reason, stop_reason=last.stop_reason
            )
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in self.prompts)
        return JSONResponse(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": _usage(prompt_tokens, completion_tokens),
            }
        )

    # -- streams ------------------------------------------------------------------------------
    async def _sse(self, engine: AsyncEngine, streams: list[Any]) -> AsyncIterator[bytes]:
        body = self.body
        options = body.stream_options
        include_usage = options is not None and options.include_usage
        continuous = include_usage and options is not None and options.continuous_usage_stats
        prompt_tokens = sum(len(p) for p in self.prompts)
        merged: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

        async def pump(index: int, stream: Any) -> None:
            try:
                async for delta in engine.deltas(stream):
                    await merged.put((index, delta))
            except Exception as exc:
                await merged.put((index, exc))
            finally:
                await merged.put((index, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        num_open = len(streams)
        num_out = [0] * len(streams)
        offsets = [0] * len(streams)
        started = [False] * len(streams)
        try:
            while num_open:
                index, item = await merged.get()
                if item is None:
                    num_open -= 1
                    continue
                if isinstance(item, BaseException):
                    yield _sse_json(error_body(str(item), 500, err_type="InternalServerError"))
                    continue
                num_out[index] = item.num_output_tokens
                if item.finish_reason == "error":
                    yield _sse_json(
                        error_body(
                            item.error or "the engine failed the request",
                            500,
                            err_type="InternalServerError",
                        )
                    )
                    continue
                choice: dict[str, Any] = {"index": index}
                if self.chat:
                    delta: dict[str, Any] = {}
                    if not started[index]:
                        delta["role"] = "assistant"
                    delta["content"] = item.text
                    choice["delta"] = delta
                else:
                    choice["text"] = item.text
                started[index] = True
                logprobs = None
                if self.num_logprobs is not None and item.logprobs is not None:
                    logprobs = self._logprobs(item.logprobs, offsets[index])
                offsets[index] += len(item.text)
                choice.update(
                    logprobs=logprobs,
                    finish_reason=item.finish_reason,
                    stop_reason=item.stop_reason,
                )
                if not item.text and not item.token_ids and item.finish_reason is None:
                    continue
                chunk = self._chunk([choice])
                if include_usage:
                    chunk["usage"] = _usage(prompt_tokens, sum(num_out)) if continuous else None
                yield _sse_json(chunk)
            if include_usage:
                chunk = self._chunk([])
                chunk["usage"] = _usage(prompt_tokens, sum(num_out))
                yield _sse_json(chunk)
            yield b"data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            for stream in streams:
                if not stream.done:
                    engine.abort(stream.req_id)

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, lps: Logprobs, text_offset: int) -> dict[str, Any]:
        tok = self.tokenizer
        k = self.num_logprobs or 0

        def text(token_id: int) -> str:
            return token_text(tok, token_id) if tok is not None else f"token_id:{token_id}"

        def value(x: float) -> float:
            return _NEG_INF_LOGPROB if not math.isfinite(x) else float(x)

        ids = np.asarray(lps.token_ids)
        values = np.asarray(lps.logprobs)
        if self.chat:
            content = []
            for row in range(len(lps)):
                t = text(int(ids[row, 0]))
                content.append(
                    {
                        "token": t,
                        "logprob": value(values[row, 0]),
                        "bytes": list(t.encode("utf-8")),
                        "top_logprobs": [
                            {
                                "token": (tt := text(int(ids[row, c]))),
                                "logprob": value(values[row, c]),
                                "bytes": list(tt.encode("utf-8")),
                            }
                            for c in range(1, k + 1)
                        ],
                    }
                )
            return {"content": content}
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = text_offset
        for row in range(len(lps)):
            t = text(int(ids[row, 0]))
            tokens.append(t)
            token_logprobs.append(value(values[row, 0]))
            entry = {t: value(values[row, 0])}
            for c in range(1, k + 1):
                entry.setdefault(text(int(ids[row, c])), value(values[row, c]))
            top.append(entry)
            offsets.append(offset)
            offset += len(t)
        return {
            "text_offset": offsets,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top,
        }


async def _until_disconnect(
    request: Request, answer: Awaitable[Response], engine: AsyncEngine, streams: list[Any]
) -> Response:
    """The answer, unless the client disconnects first: then its requests are aborted (KV
    blocks freed) and nothing is sent (vLLM's ``with_cancellation``)."""
    answer_task = asyncio.ensure_future(answer)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({answer_task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if answer_task in done:
        return answer_task.result()
    answer_task.cancel()
    for stream in streams:
        engine.abort(stream.req_id)
    return Response(status_code=499)


async def _embed(state: ServerState, body: EmbeddingRequest, request: Request) -> Response:
    model = _check_model(state, body.model)
    info = state.info
    assert info is not None  # the middleware answers 503 until the engine is in
    tokenizer = state.tokenizer
    if "embed" not in info.pooling_tasks:
        raise HTTPError(
            400, f"{model} does not serve embeddings (it generates text)", param="model"
        )
    if body.dimensions is not None:
        raise HTTPError(
            400,
            "dimensions is not supported (the model's own size is returned)",
            param="dimensions",
        )
    items: list[str | list[int]]
    raw = body.input
    if isinstance(raw, str):
        items = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [raw]  # type: ignore[list-item]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items:
        raise HTTPError(400, "input: no input given", param="input")

    def encode() -> list[list[int]]:
        out: list[list[int]] = []
        for item in items:
            if isinstance(item, str):
                if tokenizer is None:
                    raise HTTPError(400, f"{model} has no tokenizer: send token ids", param="input")
                out.append(tokenizer.encode(item, add_special_tokens=True))
            else:
                out.append(list(item))
        return out

    prompts = await asyncio.to_thread(encode)  # beside the event loop: inputs may be large
    if len(prompts) > MAX_SEQUENCES_PER_REQUEST:
        raise HTTPError(
            400,
            f"{len(prompts)} inputs; at most {MAX_SEQUENCES_PER_REQUEST} per request",
            param="input",
        )
    engine = _engine(state, len(prompts))
    req_id = "embd-" + uuid.uuid4().hex
    streams = [
        engine.prepare(engine.new_request_id(req_id), prompt, pooling=PoolingParams(task="embed"))
        for prompt in prompts
    ]
    try:
        await engine.submit_all(streams)
    except InvalidRequestError as exc:
        raise HTTPError(400, str(exc)) from None

    async def answer() -> JSONResponse:
        async def last(stream: Any) -> Delta:
            result = None
            async for delta in engine.deltas(stream):
                result = delta
            assert result is not None
            return result

        results = await asyncio.gather(*(last(s) for s in streams))
        data = []
        for index, delta in enumerate(results):
            if delta.pooled is None:
                raise HTTPError(500, delta.error or "the engine returned no embedding")
            vector = [float(x) for x in delta.pooled]
            embedding: Any = vector
            if body.encoding_format == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "embedding": embedding, "index": index})
        num_tokens = sum(len(p) for p in prompts)
        return JSONResponse(
            {
                "id": req_id,
                "object": "list",
                "created": int(time.time()),
                "model": model,
                "data": data,
                "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
            }
        )

    return await _until_disconnect(request, answer(), engine, streams)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
    }


def _sse_json(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


__all__ = ["HTTPError", "ServerState", "create_app"]
