"""Per-request sampling parameters, validated when built (field names and ranges follow vLLM's
``SamplingParams``; the order in which runners apply them is ``docs/sampling.md``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from turnout.engine.errors import InvalidRequestError

#: A custom logits processor: ``fn(output_token_ids, logits) -> logits`` or
#: ``fn(prompt_token_ids, output_token_ids, logits) -> logits`` where ``logits`` is the
#: request's ``[vocab_size] float32`` row (a torch tensor); the returned row replaces it.
LogitsProcessor = Callable[..., Any]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Runners keep per-request parameters in int32 / float32 tables (runner_v1's numpy batch,
# runner_v2's device table): a value outside these ranges would overflow the step of the
# whole batch, or turn into inf / 0 and mean something else on one runner than the other.
_INT32_MAX = 2**31 - 1
_F32_MAX = 3.4028234663852886e38  # numpy.finfo(float32).max
_F32_TINY = 1.1754943508222875e-38  # smallest normal float32: no flush-to-zero surprises
_GREEDY_EPS = 1e-5  # docs/sampling.md step 5: temperature below this samples greedily


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_f32(value: object) -> bool:
    """A real that float32 holds without overflow or underflow to 0 (or 0 itself)."""
    if not _is_real(value):
        return False
    magnitude = abs(float(value))  # type: ignore[arg-type]  # _is_real: an int or a float
    return magnitude == 0 or _F32_TINY <= magnitude <= _F32_MAX


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. Immutable; every field is checked in ``__post_init__``.

    Attributes:
        max_tokens: output tokens to generate at most (``>= 1``).
        min_tokens: EOS and ``stop_token_ids`` are masked until this many are out
            (``0 <= min_tokens <= max_tokens``, below ``2**31``).
        temperature: ``>= 0``; below 1e-5 sampling is greedy (argmax, ties to the lowest id);
            at most float32's largest value (runners divide in float32).
        top_p: nucleus mass in ``(0, 1]``, at least float32's smallest normal (1.2e-38); 1
            keeps every token.
        min_p: in ``[0, 1]``; a token whose probability (after temperature) is below
            ``min_p`` times the most likely token's is dropped, before top-k and top-p (vLLM's
            ``MinPLogitsProcessor``, ``vllm/v1/sample/logits_processor/builtin.py``). 0
            disables it; 1 keeps only the most likely token(s). Greedy requests ignore it.
        top_k: ``-1`` or ``0`` keeps every token, else the ``k`` most likely
            (``-1 <= top_k < 2**31``).
        presence_penalty: subtracted once per token present in the output, ``[-2, 2]``.
        frequency_penalty: subtracted per occurrence in the output, ``[-2, 2]``.
        repetition_penalty: CTRL's penalty over prompt and output tokens (Keskar et al. 2019),
            ``> 0`` within float32's normal range; 1 disables it.
        seed: seeds the stateless Gumbel noise (``kernels/gumbel_noise.py``); an int64. ``None``
            lets the engine draw one from its own generator when the request is added.
        stop_token_ids: tokens that finish the request (after ``min_tokens``), kept even when
            ``ignore_eos`` is set.
        ignore_eos: keep generating past EOS (only EOS: stop ids still stop).
        logprobs: return the sampled token's logprob and the ``k`` most likely tokens' at each
            step (``>= 0``, at most the engine's ``max_logprobs`` and the vocabulary size).
        prompt_logprobs: the same for every prompt token after the first.
        logits_processors: callables applied in order to the request's logits row (see
            :data:`LogitsProcessor`); runner_v1 honours them, runner_v2 refuses them.

    Raises:
        InvalidRequestError: a field has the wrong type or is out of range; the message names
            the field, its value and the accepted range.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logits_processors: tuple[LogitsProcessor, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # Accept any sequence for the tuple fields (lists are what callers naturally pass).
        for name in ("stop_token_ids", "logits_processors"):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                _require(False, name, value, "a list")
            object.__setattr__(self, name, tuple(value))
        self._check_ints()
        self._check_reals()
        self._check_misc()

    def _check_ints(self) -> None:
        _require(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an int >= 1",
        )
        _require(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= min(self.max_tokens, _INT32_MAX),
            "min_tokens",
            self.min_tokens,
            f"an int in [0, max_tokens={self.max_tokens}] and below 2**31",
        )
        _require(
            _is_int(self.top_k) and -1 <= self.top_k <= _INT32_MAX,
            "top_k",
            self.top_k,
            "an int in [-1, 2**31 - 1] (-1 or 0: all tokens)",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None or (_is_int(value) and value >= 0), name, value, "None or an int >= 0"
            )
        _require(
            self.seed is None or (_is_int(self.seed) and _INT64_MIN <= self.seed <= _INT64_MAX),
            "seed",
            self.seed,
            "None or a 64-bit signed int",
        )
        for token_id in self.stop_token_ids:
            _require(
                _is_int(token_id) and token_id >= 0,
                "stop_token_ids",
                self.stop_token_ids,
                "a list of token ids >= 0",
            )

    def _check_reals(self) -> None:
        _require(
            _is_real(self.temperature) and 0 <= self.temperature <= _F32_MAX,
            "temperature",
            self.temperature,
            "a finite number >= 0 (at most 3.4e38, float32's largest)",
        )
        _require(
            _is_f32(self.top_p) and 0 < self.top_p <= 1,
            "top_p",
            self.top_p,
            "a number in (0, 1] (at least 1.2e-38, float32's smallest normal)",
        )
        _require(
            _is_f32(self.min_p) and 0 <= self.min_p <= 1,
            "min_p",
            self.min_p,
            "a number in [0, 1] (0 disables it; at least 1.2e-38, float32's smallest normal, "
            "when above 0)",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(_is_real(value) and -2 <= value <= 2, name, value, "a number in [-2, 2]")
        _require(
            _is_f32(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            self.repetition_penalty,
            "a number > 0 within float32's normal range [1.2e-38, 3.4e38]",
        )

    def _check_misc(self) -> None:
        _require(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "a bool")
        for fn in self.logits_processors:
            _require(callable(fn), "logits_processors", fn, "a list of callables")

    @property
    def is_greedy(self) -> bool:
        """``True`` when sampling is argmax (docs/sampling.md step 5)."""
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """``True`` when any of the three penalties changes the logits."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    def verify(self, *, max_logprobs: int, vocab_size: int) -> None:
        """Check the fields that depend on the engine: logprob counts and token ids.

        Raises:
            InvalidRequestError: ``logprobs``/``prompt_logprobs`` above ``max_logprobs`` or
                above ``vocab_size``, or a stop token id outside ``[0, vocab_size)``.
        """
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > max_logprobs:
                raise InvalidRequestError(
                    f"{name}={value} is above the engine's max_logprobs={max_logprobs}; "
                    f"ask for at most {max_logprobs} or raise max_logprobs"
                )
            if value is not None and value > vocab_size:
                raise InvalidRequestError(
                    f"{name}={value} is above the vocabulary size {vocab_size}: there are only "
                    f"{vocab_size} tokens to rank"
                )
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise InvalidRequestError(
                f"stop_token_ids {bad} are outside the vocabulary (size {vocab_size})"
            )

    def with_seed(self, seed: int) -> SamplingParams:
        """A copy with ``seed`` set (the engine seeds unseeded requests when adding them)."""
        return replace(self, seed=seed)

    def describe(self) -> dict[str, Any]:
        """The fields as a plain dict (logits processors by name), for logs and JSON."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stop_token_ids"] = list(self.stop_token_ids)
        out["logits_processors"] = [
            getattr(fn, "__name__", repr(fn)) for fn in self.logits_processors
        ]
        return out


def _require(ok: bool, name: str, value: object, accepted: str) -> None:
    if not ok:
        raise InvalidRequestError(
            f"SamplingParams.{name}={value!r} is invalid: expected {accepted}"
        )


__all__ = ["LogitsProcessor", "SamplingParams"]
