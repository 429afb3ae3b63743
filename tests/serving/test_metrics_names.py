"""``/metrics`` speaks vLLM's names: every ``vllm:*`` family the server exports is one that
vLLM 0.33.0's ``PrometheusStatLogger`` registers (policies/reference/vllm-0.33/metrics.json,
written from vLLM's own source by ``python -m referee metrics``), with its type, help text,
label names and buckets, parsed back with prometheus_client's own text parser."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from turnout.serving.metrics import ServingMetrics, request_tokens_buckets

TABLE = Path(__file__).resolve().parents[2] / "policies/reference/vllm-0.33/metrics.json"
# The list: what a Grafana board or an alert rule for vLLM reads first.
REQUIRED = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:num_preemptions",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
}
# vLLM's metrics of features turnout's engine does not have (their series could only be 0).
NOT_EXPORTED = {
    "vllm:num_requests_kv_fetch_by_stage",  # KV connectors
    "vllm:engine_sleep_state",  # sleep mode
    "vllm:corrupted_requests",  # NaN logit checks (VLLM_COMPUTE_NANS_IN_LOGITS)
    "vllm:watermark_requests",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:prompt_tokens_cached_by_source",  # cache tiers beyond device memory
    "vllm:kv_block_lifetime_seconds",  # --kv-cache-metrics sampling
    "vllm:kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds",
    "vllm:lora_requests_info",
}
MAX_MODEL_LEN = 2048


def exported() -> dict[str, object]:
    metrics = ServingMetrics("m", MAX_MODEL_LEN, {"runner": "v2", "mode": "auto"})
    metrics.time_to_first_token.observe(0.01)
    text = generate_latest(metrics.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_vllm_metric_has_vllms_type_help_labels_and_buckets() -> None:
    table = json.loads(TABLE.read_text())
    assert table["vllm_version"] == "0.33.0"
    want = {m["name"]: m for m in table["metrics"]}
    families = exported()
    # prometheus_client writes each counter's and histogram's start time as a `_created`
    # series, which the 0.0.4 text parser reads as a family of its own (vLLM's do the same).
    names = {n for n in families if n.startswith("vllm:") and not n.endswith("_created")}
    assert names >= REQUIRED
    assert names == set(want) - NOT_EXPORTED
    for name in names:
        family, spec = families[name], want[name]
        assert family.type == spec["type"], name  # type: ignore[attr-defined]
        assert family.documentation == spec["documentation"], name  # type: ignore[attr-defined]
        samples = family.samples  # type: ignore[attr-defined]
        assert samples, f"{name} has no series: vLLM creates its series at start"
        for sample in samples:
            assert set(sample.labels) - {"le"} == set(spec["labelnames"]), (name, sample)
        if spec["type"] == "histogram":
            family_key = spec["buckets"]["family"]
            if family_key == "request_tokens":
                buckets = [float(b) for b in request_tokens_buckets(MAX_MODEL_LEN)]
            else:
                buckets = table["bucket_families"][family_key]
            les = [float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")]
            assert les == [*buckets, float("inf")], name


def test_the_request_tokens_buckets_follow_vllms_1_2_5_rule() -> None:
    assert request_tokens_buckets(100) == [1, 2, 5, 10, 20, 50, 100]  # vLLM's docstring example
    assert request_tokens_buckets(2048)[-1] == 2000


def test_the_runner_info_metric_splits_series_by_runner() -> None:
    info = exported()["turnout:runner_info"]
    (sample,) = info.samples  # type: ignore[attr-defined]
    assert sample.labels == {"model_name": "m", "mode": "auto", "runner": "v2"}
    assert sample.value == 1.0
