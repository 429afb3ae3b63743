"""Text of a growing output, a step at a time, and its stop strings.

Incremental detokenization decodes only a window of the last tokens: ``decode(ids[prefix:])``
minus ``decode(ids[prefix:read])`` is the text the tokens after ``read`` added, once it no
longer ends in U+FFFD (a multi-byte character still incomplete). This is the offsets scheme of
vLLM's ``detokenize_incrementally`` (vllm/transformers_utils/detokenizer_utils.py), which keeps
each step's cost independent of the output's length.

Stop strings follow vLLM's ``check_stop_strings`` (vllm/v1/engine/detokenizer.py): each step
searches the new text plus the ``len(stop) - 1`` characters before it; on a match the text ends
before the stop string (or after it with ``include_stop_str_in_output``) and the request
finishes with reason ``stop`` and ``stop_reason`` the string. While a request with stop strings
streams, the last ``max(len(stop)) - 1`` characters are held back, so no prefix of a stop
string is ever sent and then taken back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Tokens decoded before the first new one: enough context for byte-level BPE and
# SentencePiece to render a leading space or a merged character as the full text would.
_PREFIX_WINDOW = 6


class IncrementalDetokenizer:
    """The text of one request's output tokens, extended a step at a time.

    Args:
        tokenizer: a :class:`turnout.engine.model.tokenizer.Tokenizer` (``decode(ids)``).
        stop: stop strings (empty: none).
        include_stop_str_in_output: keep a matched stop string in the text.
    """

    def __init__(
        self, tokenizer: Any, stop: Sequence[str] = (), *, include_stop_str_in_output: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix = 0  # first token of the decode window (context for the new ones)
        self._read = 0  # tokens whose text is in self.text
        self._sent = 0  # characters of self.text already handed out
        self.stop_reason: str | None = None

    def add(self, new_token_ids: Sequence[int]) -> bool:
        """Append tokens; returns True when a stop string matched (the text is cut there and
        nothing after it may be added)."""
        if self.stop_reason is not None:
            return True
        self.token_ids.extend(new_token_ids)
        before = len(self.text)
        ids = self.token_ids
        if self._read < len(ids):
            prefix_text = self._tokenizer.decode(ids[self._prefix : self._read])
            full_text = self._tokenizer.decode(ids[self._prefix :])
            # A trailing U+FFFD is a multi-byte character still incomplete: wait for its
            # other tokens (the window grows until it is whole).
            if not full_text.endswith("\ufffd") and len(full_text) >= len(prefix_text):
                self.text += full_text[len(prefix_text) :]
                self._read = len(ids)
                self._prefix = max(0, self._read - _PREFIX_WINDOW)
        if self.stop:
            self._check_stop(before)
        return self.stop_reason is not None

    def _check_stop(self, before: int) -> None:
        for stop in self.stop:
            start = max(0, before - len(stop) + 1)
            at = self.text.find(stop, start)
            if at >= 0:
                self.stop_reason = stop
                end = at + len(stop) if self.include_stop_str_in_output else at
                self.text = self.text[:end]
                return

    def flush(self) -> None:
        """The output is complete: text still waiting on an incomplete character is added as
        the tokenizer renders it (with U+FFFD), as a full decode would show it."""
        if self._read < len(self.token_ids) and self.stop_reason is None:
            prefix_text = self._tokenizer.decode(self.token_ids[self._prefix : self._read])
            full_text = self._tokenizer.decode(self.token_ids[self._prefix :])
            before = len(self.text)
            self.text += full_text[len(prefix_text) :]
            self._read = len(self.token_ids)
            if self.stop:
                self._check_stop(before)

    def take(self, finished: bool) -> str:
        """The text not handed out yet; while unfinished, the characters that could still be
        the start of a stop string stay back."""
        end = len(self.text) if finished or self.stop_reason else len(self.text) - self._hold
        if end <= self._sent:
            return ""
        out = self.text[self._sent : end]
        self._sent = end
        return out


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token's own text (special tokens kept), as vLLM shows it in logprobs."""
    return str(tokenizer.decode([token_id], skip_special_tokens=False))


__all__ = ["IncrementalDetokenizer", "token_text"]
