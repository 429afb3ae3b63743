"""Incremental detokenization equals a whole decode, a token at a time, on the real SmolLM2
tokenizer, multi-byte characters split across tokens included; stop strings cut the text as
vLLM does and nothing past a stop string is ever handed out."""

from __future__ import annotations

import random

import pytest
from serving_helpers import SMOLLM2

from turnout.engine.model.tokenizer import load_tokenizer
from turnout.serving.detokenize import IncrementalDetokenizer

TEXTS = [
    "The capital of France is Paris.",
    "naïve café — 東京タワー 🎉🎉 ünïcödé",
    "  leading spaces\n\nand new lines\t tabs",
    "emoji 👩‍👩‍👧 joined, and a long 的的的的 run",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(SMOLLM2)


@pytest.mark.parametrize("text", TEXTS)
def test_a_token_at_a_time_equals_the_whole_decode(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = []
    for token in ids:
        detok.add([token])
        pieces.append(detok.take(finished=False))
    detok.flush()
    pieces.append(detok.take(finished=True))
    assert "".join(pieces) == tokenizer.decode(ids) == detok.text
    assert not any("\ufffd" in p for p in pieces)  # a split character is never sent in halves


def test_random_chunks_of_random_tokens_equal_the_whole_decode(tokenizer) -> None:
    rng = random.Random(7)
    for _ in range(30):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        detok = IncrementalDetokenizer(tokenizer)
        out, i = [], 0
        while i < len(ids):
            step = rng.randrange(1, 4)
            detok.add(ids[i : i + step])
            out.append(detok.take(finished=False))
            i += step
        detok.flush()
        out.append(detok.take(finished=True))
        assert "".join(out) == tokenizer.decode(ids)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_cuts_the_text_and_nothing_after_it_is_sent(tokenizer, include: bool) -> None:
    text = "one two three four five"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, ["ee f"], include_stop_str_in_output=include)
    sent = []
    for token in ids:
        stopped = detok.add([token])
        sent.append(detok.take(finished=stopped))
        if stopped:
            break
    assert detok.stop_reason == "ee f"
    want = "one two three f" if include else "one two thr"
    assert "".join(sent) == detok.text == want
    assert detok.add([ids[-1]]) is True and detok.take(finished=True) == ""


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, ["STOP"])
    detok.add(tokenizer.encode("go ST", add_special_tokens=False))
    assert detok.take(finished=False) == "go"  # " ST" could be the start of "STOP"
    detok.add(tokenizer.encode("ay", add_special_tokens=False))
    detok.flush()
    assert detok.take(finished=True) == " STay"
    assert detok.stop_reason is None
