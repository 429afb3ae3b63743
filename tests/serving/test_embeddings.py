"""``/v1/embeddings`` on the shipped all-MiniLM-L6-v2, through the official client: the vectors
are the offline ``LLM.embed`` ones, base64 decodes to the same floats, and a generation
endpoint on a pooling model is refused with 400."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import numpy as np
import openai
import pytest
from serving_helpers import MINILM, Server, start_server

from turnout.engine.llm import LLM

TEXTS = ["A cat sits on the mat.", "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        MINILM, tmp_path_factory.mktemp("embed") / "minilm.log", "--served-model-name", "minilm"
    )
    yield s
    s.stop()


def test_embeddings_equal_the_offline_ones(server: Server) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    r = c.embeddings.create(model="minilm", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1]
    llm = LLM(MINILM, device="cpu")
    offline = [o.embedding for o in llm.embed(TEXTS)]
    for got, want in zip(r.data, offline, strict=True):
        assert len(got.embedding) == 384
        np.testing.assert_allclose(got.embedding, want, rtol=1e-5, atol=1e-6)
    assert r.usage.prompt_tokens == sum(len(llm.tokenizer.encode(t)) for t in TEXTS)
    b64 = c.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="base64")
    raw = base64.b64decode(b64.data[0].embedding)  # type: ignore[arg-type]
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    np.testing.assert_allclose(floats, offline[0], rtol=1e-5, atol=1e-6)


def test_generation_on_a_pooling_model_and_bad_inputs_get_400(server: Server) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="pooling model"):
        c.completions.create(model="minilm", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        c.embeddings.create(model="minilm", input="hi", dimensions=8)
    with pytest.raises(openai.BadRequestError):
        c.embeddings.create(model="minilm", input=[])
    with pytest.raises(openai.BadRequestError):  # longer than max_model_len: the engine refuses
        c.embeddings.create(model="minilm", input=[[1] * 100_000])
    ok = c.embeddings.create(model="minilm", input="still serving")
    assert len(ok.data[0].embedding) == 384
