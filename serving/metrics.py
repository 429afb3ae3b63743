"""``/metrics`` of ``turnout engine serve``: vLLM's Prometheus names, types, labels and buckets.

Every ``vllm:*`` metric here is one that vLLM 0.33.0 registers in
``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger.__init__``), with that file's help text
and label names (``model_name``, ``engine``; ``finished_reason``, ``source``, ``reason`` where
it adds one) and the buckets of ``vllm/v1/metrics/buckets.py``. The table of that release,
read from its own source by ``python -m referee metrics``, is
``policies/reference/vllm-0.33/metrics.json``; tests/serving/test_metrics_names.py holds this
module's output to it, so Grafana dashboards and alert rules written for vLLM read a turnout
server unchanged. Counters are registered without ``_total`` and exposed with it
(``vllm:prompt_tokens_total``), as prometheus_client does for vLLM.

Metrics of features turnout's engine does not have (KV transfer, multimodal and external
prefix caches, LoRA, sleep mode, watermarking, KV block residency sampling) are not exported:
a series that can only ever be zero would claim a feature.

turnout adds one info gauge, ``turnout:runner_info`` (``model_name``, ``runner``, ``mode``:
``auto`` or ``pinned``, ``deployment``, ``family``, ``stage``, ``policy_digest``), set to 1:
``vllm:x * on(model_name) group_left(runner) turnout:runner_info`` splits any vLLM series by
runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The vLLM release whose metric table this module follows (the engine registers with it: the
# ``vllm_version`` label of its scrape target).
METRICS_RELEASE = "0.33.0"

# vllm/v1/metrics/buckets.py (0.33.0), the defaults of each family.
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                               2560.0)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# vLLM's ADMISSION_REASONS and PromptTokenStats.ALL_SOURCES (loggers.py, stats.py).
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISHED_REASONS = ("stop", "length", "abort", "error")


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """vLLM's ``request_tokens`` family: the 1-2-5 series up to ``max_model_len``
    (``build_1_2_5_buckets`` in vllm/v1/metrics/buckets.py)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


@dataclass
class RequestTimes:
    """One request's timestamps (``time.monotonic`` seconds) and counts, for the histograms
    recorded when it finishes."""

    arrival: float
    num_prompt_tokens: int
    max_tokens: int
    n: int = 1
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    itl: list[float] = field(default_factory=list)


class ServingMetrics:
    """The server's metrics in their own registry (``/metrics`` renders only these).

    Args:
        model_name: the served model name (the ``model_name`` label).
        max_model_len: caps the token-count buckets (vLLM's rule).
        runner_info: the ``turnout:runner_info`` labels (runner, mode, deployment, ...).
    """

    def __init__(self, model_name: str, max_model_len: int, runner_info: dict[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        base = ["model_name", "engine"]
        values = (model_name, "0")
        self.model_name = model_name

        def gauge(name: str, doc: str, extra: Iterable[str] = ()) -> Gauge:
            return Gauge(name, doc, [*base, *extra], registry=r)

        def counter(name: str, doc: str, extra: Iterable[str] = ()) -> Counter:
            return Counter(name, doc, [*base, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: Iterable[float]) -> Histogram:
            return Histogram(name, doc, base, buckets=list(buckets), registry=r)

        tokens = request_tokens_buckets(max_model_len)
        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ["reason"],
        )
        self.num_requests_waiting_capacity = waiting_by_reason.labels(*values, "capacity")
        waiting_by_reason.labels(*values, "deferred").set(0)  # nothing is ever deferred here
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(*values)
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*values)
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*values)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*values)
        by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"]
        )
        self.prompt_tokens_by_source = {
            s: by_source.labels(*values, s) for s in PROMPT_TOKEN_SOURCES
        }
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        ).labels(*values)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*values)
        success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["finished_reason"],
        )
        self.request_success = {f: success.labels(*values, f) for f in FINISHED_REASONS}
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        self.admission_rejections = {a: rejections.labels(model_name, a) for a in ADMISSION_REASONS}
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        ).labels(*values)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        ).labels(*values)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        ).labels(*values)
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        ).labels(*values)
        self.request_params_n = histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        ).labels(*values)
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        ).labels(*values)
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        ).labels(*values)
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        ).labels(*values)
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        ).labels(*values)
        latency = REQUEST_LATENCY_BUCKETS
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            latency,
        ).labels(*values)
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            latency,
        ).labels(*values)
        self.request_inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            latency,
        ).labels(*values)
        self.request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            latency,
        ).labels(*values)
        self.request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            latency,
        ).labels(*values)
        self.request_num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        ).labels(*values)
        self.request_prefill_kv_computed_tokens = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        ).labels(*values)
        info_labels = ["model_name", *sorted(runner_info)]
        Gauge(
            "turnout:runner_info",
            "The runner this server's deployment got and why (1): join on model_name to split "
            "vllm:* series by runner.",
            info_labels,
            registry=r,
        ).labels(model_name, *(runner_info[k] for k in sorted(runner_info))).set(1)

    def request_finished(self, times: RequestTimes, finished_reason: str, now: float) -> None:
        """Record one finished request (vLLM records these on every finish, aborts included).

        Args:
            times: its timestamps and counts.
            finished_reason: ``stop``, ``length``, ``abort`` or ``error``.
            now: ``time.monotonic()`` at its finish.
        """
        self.request_success[finished_reason].inc()
        self.e2e_request_latency.observe(now - times.arrival)
        self.request_prompt_tokens.observe(times.num_prompt_tokens)
        self.request_generation_tokens.observe(times.num_generation_tokens)
        self.request_max_num_generation_tokens.observe(times.max_tokens)
        self.request_params_max_tokens.observe(times.max_tokens)
        self.request_params_n.observe(times.n)
        self.request_num_preemptions.observe(times.num_preemptions)
        if times.scheduled is not None:
            self.request_queue_time.observe(times.scheduled - times.arrival)
            self.request_inference_time.observe(now - times.scheduled)
            self.request_prefill_kv_computed_tokens.observe(
                max(0, times.num_prompt_tokens - times.num_cached_tokens)
            )
            if times.first_token is not None:
                self.request_prefill_time.observe(times.first_token - times.scheduled)
        if times.first_token is not None:
            self.request_decode_time.observe(now - times.first_token)
            if times.num_generation_tokens > 1 and times.last_token is not None:
                self.request_time_per_output_token.observe(
                    (times.last_token - times.first_token) / (times.num_generation_tokens - 1)
                )


__all__ = ["ADMISSION_REASONS", "RequestTimes", "ServingMetrics", "request_tokens_buckets"]
