"""The pooling tasks beside ``embed`` on every runner, against HF transformers on checkpoints
transformers itself wrote (fp32, CPU): a cross-encoder's ``score`` equals
``BertForSequenceClassification`` logits (the published ms-marco config, 2 of its layers) and
``rerank`` orders as HF's scores do; ``classify`` logits equal HF's; a reward head on a small
Llama (Skywork's config shrunk) equals ``LlamaForSequenceClassification`` at the last token,
prompts of many lengths in one batch and over several steps; bad input gets a clear error."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_DECODER_CONFIGS, prompts_for

sys.path.insert(0, str(Path(__file__).parents[1] / "engine" / "model"))
from pooling_models import POOLING_CONFIGS, hf_logits, hf_pooling_dir, load_hf_classifier
from tiny_model_configs import TINY_ENCODER_CONFIGS

from turnout.engine.errors import EngineConfigError, InvalidRequestError
from turnout.engine.llm import LLM
from turnout.engine.model import write_random_weights
from turnout.engine.pooling_params import PoolingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("pydantic")  # LLM asks the oracle

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany.",
    "The quick brown fox jumps over the lazy dog.",
    "capital",
    "France, officially the French Republic, is a country in Western Europe; its capital is Paris.",
]


@pytest.fixture(scope="session")
def pooling_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: hf_pooling_dir(tmp_path_factory, name) for name in POOLING_CONFIGS}


def _llm(path: Path, runner: str, **kwargs: object) -> LLM:
    llm = LLM(path, runner, device="cpu", environ={}, **kwargs)
    assert type(llm.core.runner).__module__.startswith(f"turnout.runner_{runner}.")
    return llm


def _hf_pair_logits(path: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = load_hf_classifier(path)(**batch).logits[:, 0]
    return logits, batch


def test_cross_encoder_score_equals_hf_logits(
    runner_name: str, pooling_dirs: dict[str, Path]
) -> None:
    path = pooling_dirs["cross-encoder"]
    want, batch = _hf_pair_logits(path)
    assert want.std() > 0.3  # random logits that spread: the order below is a real test
    scores = _llm(path, runner_name).score(QUERY, DOCUMENTS)
    assert [s.document for s in scores] == DOCUMENTS and all(s.error is None for s in scores)
    for i, s in enumerate(scores):  # HF's pair tokenization: [CLS] q [SEP] d [SEP], types 0 then 1
        n = int(batch["attention_mask"][i].sum())
        assert s.prompt_token_ids == batch["input_ids"][i, :n].tolist()
        assert (
            s.token_type_ids == batch["token_type_ids"][i, :n].tolist()
            and s.token_type_ids[-1] == 1
        )
    # ms-marco's config names Identity as CrossEncoder's activation: the score is the logit.
    torch.testing.assert_close(torch.tensor([s.score for s in scores]), want, atol=1e-4, rtol=0)


def test_rerank_orders_as_hf_scores(runner_name: str, pooling_dirs: dict[str, Path]) -> None:
    path = pooling_dirs["cross-encoder"]
    want, _ = _hf_pair_logits(path)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -want[i].item())
    llm = _llm(path, runner_name)
    ranked = llm.rerank(QUERY, DOCUMENTS)
    assert [r.index for r in ranked] == order
    assert [r.document for r in ranked] == [DOCUMENTS[i] for i in order]
    torch.testing.assert_close(
        torch.tensor([r.relevance_score for r in ranked]), want[order], atol=1e-4, rtol=0
    )
    assert [r.index for r in llm.rerank(QUERY, DOCUMENTS, top_n=2)] == order[:2]


def test_a_sigmoid_cross_encoder_scores_sigmoid_of_the_logit(
    runner_name: str, pooling_dirs: dict[str, Path]
) -> None:
    # Without sbert_ce_default_activation_function, sentence-transformers' CrossEncoder applies
    # a sigmoid to a one-label head; classify's probs do the same.
    path = pooling_dirs["cross-encoder-sigmoid"]
    want, _ = _hf_pair_logits(path)
    llm = _llm(path, runner_name)
    scores = torch.tensor([s.score for s in llm.score(QUERY, DOCUMENTS)])
    torch.testing.assert_close(scores, torch.sigmoid(want), atol=1e-5, rtol=0)
    (out,) = llm.classify(DOCUMENTS[:1])
    hf = hf_logits(load_hf_classifier(path), out.prompt_token_ids)
    torch.testing.assert_close(torch.tensor(out.logits), hf, atol=1e-4, rtol=0)
    assert out.probs == pytest.approx([1 / (1 + math.exp(-out.logits[0]))])


def test_classify_equals_hf_logits(runner_name: str, pooling_dirs: dict[str, Path]) -> None:
    path = pooling_dirs["bert-classifier"]  # 3 labels, no tokenizer: token ids
    hf = load_hf_classifier(path)
    prompts = prompts_for(160, [3, 17, 9, 40, 1], seed=2)
    outs = _llm(path, runner_name).classify(prompts)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.error is None and out.prompt_token_ids == prompt and len(out.logits) == 3
        want = hf_logits(hf, prompt)
        torch.testing.assert_close(torch.tensor(out.logits), want, atol=1e-4, rtol=0)
        torch.testing.assert_close(
            torch.tensor(out.probs, dtype=torch.float32), want.softmax(-1), atol=1e-6, rtol=0
        )
    assert torch.tensor([o.logits for o in outs]).std(0).min() > 0.05  # the prompts' logits differ


@pytest.mark.parametrize("max_num_batched_tokens", [None, 48])
def test_reward_equals_hf_last_token_logits(
    runner_name: str, pooling_dirs: dict[str, Path], max_num_batched_tokens: int | None
) -> None:
    # Lengths around the block size (16): one, a partial block, exactly one, just over, many
    # blocks; with a 48-token budget the batch runs over several steps, the scratch reused.
    path = pooling_dirs["llama-reward"]
    hf = load_hf_classifier(path)
    lengths = [5, 37, 1, 16, 17, 15, 40, 23]
    prompts = prompts_for(150, lengths, seed=5)
    kwargs = {"max_model_len": 64} | (
        {"max_num_batched_tokens": max_num_batched_tokens} if max_num_batched_tokens else {}
    )
    llm = _llm(path, runner_name, **kwargs)
    before = llm.core.num_steps
    outs = llm.reward(prompts)
    # One step holds the batch, or the 48-token budget splits it, first come first served:
    # [5, 37, 1], [16, 17, 15], [40], [23].
    assert llm.core.num_steps - before == (1 if max_num_batched_tokens is None else 4)
    got = torch.tensor([o.reward for o in outs])
    want = torch.stack([hf_logits(hf, p) for p in prompts])
    assert got.shape == (len(prompts), 1) and all(o.error is None for o in outs)
    assert want.std() > 0.1
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # classify on a reward model: the same logits, sigmoid probabilities (one label)
    (c,) = llm.classify([prompts[1]])
    torch.testing.assert_close(torch.tensor(c.logits), want[1], atol=1e-4, rtol=0)
    assert c.probs == pytest.approx([1 / (1 + math.exp(-c.logits[0]))])


def test_a_pair_longer_than_max_model_len_is_rejected_alone(
    runner_name: str, pooling_dirs: dict[str, Path]
) -> None:
    path = pooling_dirs["cross-encoder"]
    llm = _llm(path, runner_name, max_model_len=32)
    docs = [DOCUMENTS[0], "the lazy dog " * 20, DOCUMENTS[3]]
    scores = llm.score(QUERY, docs)
    assert scores[1].score is None
    assert scores[1].error is not None and scores[1].error.startswith("document 1: ")
    assert "more than max_model_len=32" in scores[1].error
    want, _ = _hf_pair_logits(path)
    torch.testing.assert_close(
        torch.tensor([scores[0].score, scores[2].score]), want[[0, 3]], atol=1e-4, rtol=0
    )
    ranked = llm.rerank(QUERY, docs)  # the unscored document comes last, with its error
    assert (
        [r.index for r in ranked][-1] == 1
        and ranked[-1].relevance_score is None
        and ranked[-1].error
    )
    assert sorted(r.index for r in ranked[:2]) == [0, 2]


def test_bad_score_input_is_named(runner_name: str, pooling_dirs: dict[str, Path]) -> None:
    llm = _llm(pooling_dirs["cross-encoder"], runner_name)
    with pytest.raises(InvalidRequestError, match="score: the document list is empty"):
        llm.score(QUERY, [])
    with pytest.raises(InvalidRequestError, match="score: the document list is empty"):
        llm.rerank(QUERY, [])
    with pytest.raises(ValueError, match="top_n must be a positive int or None, got 0"):
        llm.rerank(QUERY, DOCUMENTS, top_n=0)
    with pytest.raises(
        InvalidRequestError,
        match=r"score: the query is one text or one list of token ids, got \['a', 'b'\]",
    ):
        llm.score(["a", "b"], DOCUMENTS)
    # A batch of one token-id list is not one query (it was read as one and the document blamed).
    with pytest.raises(
        InvalidRequestError,
        match=r"score: the query is one text or one list of token ids, got \[\[101",
    ):
        llm.score([[101, 2000]], [[2001, 102]])
    with pytest.raises(InvalidRequestError, match="got a dict"):  # its keys were scored
        llm.score(QUERY, {"a": 1})
    import numpy as np  # numpy ints count as ints for top_n, as for token ids

    assert len(llm.rerank(QUERY, DOCUMENTS, top_n=np.int64(1))) >= 1
    (mixed,) = llm.score(QUERY, [[101, 2054, 102]])
    assert (
        mixed.error == "document 0: the query and the document must both be text or both token ids"
    )
    # Token ids are joined as given: the caller's special tokens, types 0 then 1.
    (ids,) = llm.score([101, 2054, 102], [[3000, 102]])
    assert ids.prompt_token_ids == [101, 2054, 102, 3000, 102] and ids.token_type_ids == [
        0,
        0,
        0,
        1,
        1,
    ]


def test_a_task_the_model_does_not_serve_is_named(
    runner_name: str, pooling_dirs: dict[str, Path], tmp_path: Path
) -> None:
    llama, bert = tmp_path / "llama", tmp_path / "bert"
    write_random_weights(TINY_DECODER_CONFIGS["llama"], llama, dtype=torch.float32, seed=1)
    write_random_weights(TINY_ENCODER_CONFIGS["bert"], bert, dtype=torch.float32, seed=1)
    generate = _llm(llama, runner_name, max_model_len=64)
    with pytest.raises(
        EngineConfigError,
        match=rf"{llama} is not a pooling model \(LlamaForCausalLM generates "
        r"text\): it does not serve the 'score' task; use generate\(\)",
    ):
        generate.score("q", ["d"])
    embedding = _llm(bert, runner_name)
    with pytest.raises(
        EngineConfigError,
        match=rf"{bert} \(BertModel\) does not serve the 'classify' task, which "
        r"needs a sequence classifier .*; it serves: embed",
    ):
        embedding.classify([[5, 6]])
    classifier = _llm(pooling_dirs["bert-classifier"], runner_name)
    with pytest.raises(
        EngineConfigError,
        match=r"does not serve the 'score' task, which needs a cross-encoder "
        r"\(BertForSequenceClassification with one label\); it serves: classify",
    ):
        classifier.score([5], [[6]])
    with pytest.raises(
        EngineConfigError, match=r"does not serve the 'reward' task.*it serves: classify"
    ):
        classifier.reward([[5, 6]])
    with pytest.raises(
        EngineConfigError,
        match=r"is a pooling model \(BertForSequenceClassification; tasks: "
        r"classify\): it does not generate; use classify\(\)",
    ):
        classifier.generate([[5, 6]])
    reward = _llm(pooling_dirs["llama-reward"], runner_name, max_model_len=64)
    with pytest.raises(
        EngineConfigError,
        match=r"\(LlamaForSequenceClassification\) does not serve the 'embed' "
        r"task.*it serves: classify, reward",
    ):
        reward.embed([[5, 6]])


def test_the_engine_checks_pooling_params(runner_name: str, pooling_dirs: dict[str, Path]) -> None:
    core = _llm(pooling_dirs["cross-encoder"], runner_name).core
    core.add_request(
        "good", [101, 2054, 102, 3000, 102], pooling_params=PoolingParams("score", (0, 0, 0, 1, 1))
    )
    bad = [
        (
            PoolingParams("score", (0, 1)),
            r"token_type_ids must be one 0 or 1 per prompt token \(3\), got 2 values",
        ),
        (PoolingParams("score", (0, 2, 1)), r"token_type_ids must be one 0 or 1 per prompt token"),
        (
            PoolingParams("classify", (0, 0, 1)),
            r"token_type_ids are for the 'score' task \(pairs\), not 'classify'",
        ),
        (
            PoolingParams("embed"),
            r"\S+cross-encoder does not serve the 'embed' task \(it serves: classify, score\)",
        ),
        (
            PoolingParams("rank"),
            r"unknown pooling task 'rank'; known: embed, classify, score, reward",
        ),
    ]
    for i, (params, message) in enumerate(bad):
        with pytest.raises(InvalidRequestError, match=rf"request 'bad{i}': {message}"):
            core.add_request(f"bad{i}", [101, 2054, 102], pooling_params=params)
    (done,) = core.run_until_done()
    assert done.req_id == "good" and done.pooled_output is not None and len(done.pooled_output) == 1
