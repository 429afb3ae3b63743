"""The OpenAI request bodies ``turnout engine serve`` accepts, as vLLM serves them.

Field names, defaults and ranges are OpenAI's (``/v1/completions``, ``/v1/chat/completions``,
``/v1/embeddings``) plus vLLM's sampling extensions (``top_k``, ``min_p``, ``min_tokens``,
``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``, ``include_stop_str_in_output``).
Defaults follow vLLM 0.33 (``vllm/entrypoints/openai/.../protocol.py``): completions default
to ``max_tokens=16``; chat completions, when neither ``max_tokens`` nor
``max_completion_tokens`` is given, to what the context has left.

Unknown fields are refused (400, naming the field) rather than ignored, and OpenAI fields
turnout does not implement (``logit_bias``, ``response_format``, ``tools``, ``suffix``,
``echo``, ``best_of`` above 1) are refused by name: a request never gets an answer that
silently differs from what it asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NonNegFloat = Annotated[float, Field(ge=0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
# OpenAI: at most 4 stop sequences; vLLM takes more. Bounded so a body cannot make every step
# scan thousands of strings.
MAX_STOP_STRINGS = 16
MAX_LOGPROBS_COMPLETIONS = 5  # OpenAI's bound for the legacy completions logprobs
MAX_TOP_LOGPROBS_CHAT = 20  # OpenAI's bound for chat top_logprobs
# Fields of OpenAI's API that are refused unless they hold their default: what they would do
# is not implemented, and ignoring them would answer a different question.
_UNSUPPORTED = ("logit_bias", "response_format", "tools", "tool_choice", "functions",
                "function_call", "suffix", "parallel_tool_calls", "logit_bias")  # fmt: skip


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(BaseModel):
    """Fields shared by both generation endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0  # vLLM's; 0 disables (docs/sampling.md)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=100)] = 1.0
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user tag: accepted, never used to answer
    # Refused by name when set (see _UNSUPPORTED).
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return value

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def unsupported(self) -> str | None:
        """The first field set that turnout does not implement, or None."""
        for name in _UNSUPPORTED:
            if getattr(self, name, None) not in (None, [], {}):
                return name
        return None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS_COMPLETIONS)] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.best_of is not None and self.best_of > 1:
            return "best_of"
        return super().unsupported()


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS_CHAT)] | None = None
    add_generation_prompt: bool = True


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def error_body(
    message: str, status: int, *, err_type: str, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, as vLLM fills it (``ErrorResponse``:
    vllm/entrypoints/serve/engine/protocol.py): ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}

__all__ = [
    "ERROR_TYPES",
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "error_body",
]
