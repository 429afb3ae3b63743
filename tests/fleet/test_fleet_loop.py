"""The whole loop, every part real, on PostgreSQL (a fleet's store): turnout's service, two
``turnout engine serve`` processes (a tiny Llama with random weights that transformers wrote
from a real config, on CPU) in one rollout stage (a canary the stage's canary put on V2, a
baseline on V1), Debian's Prometheus finding them through the service's HTTP SD, and Debian's
Alertmanager paging the service's receiver.

1. Prometheus discovers both engines with the rollout's labels.
2. A ramp gated by a PromQL query on vLLM's TTFT histogram (the canary's p95 at most 1 s)
   steps while the canary is healthy.
3. Latency on the canary (a queue of requests behind ``--max-num-seqs 1``) fails the gate:
   the ramp pauses. A Prometheus alert on the same series fires through Alertmanager into
   the receiver, which engages the kill switch.
4. The list of engines on an old decision shows the canary (V2, its next start V1) until it
   restarts on V1.
5. The audit log holds every step with its actor.

The timeline (seconds since the start, what happened) is printed at the end (``-s``).

Each part runs on SQLite as well in its own file (``tests/dashboard/test_closed_loop.py``,
``test_promql_gates.py``, ``test_alertmanager.py``, ``test_engine_registration.py``); the
whole loop, two engine processes, Prometheus and Alertmanager on CI's two cores, runs once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_helpers import (
    PrometheusServer,
    free_port,
    skip_under_a_shifted_clock,
    start_prometheus,
)
from service_helpers import LiveService, make_tokens, start_service
from serving_helpers import MINILM, Server, start_server

from turnout import policies
from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.decision import CanarySnapshot, CohortState

STAGE = "llama-mistral-dense"
ALERTMANAGER = shutil.which("prometheus-alertmanager")
ALERT_RULES = """
groups:
  - name: turnout-canary
    interval: 1s
    rules:
      - alert: CanaryTTFTHigh
        expr: histogram_quantile(0.95, sum by (le, turnout_stage) (rate(vllm:time_to_first_token_seconds_bucket{{turnout_cohort="canary"}}[30s]))) > {threshold}
        labels: {{severity: page}}
        annotations: {{summary: "canary p95 TTFT over {threshold} s"}}
"""

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or ALERTMANAGER is None,
    reason="needs Debian's prometheus and prometheus-alertmanager (make test installs them)",
)


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)

    def say(self, what: str) -> None:
        self.events.append((time.monotonic() - self.t0, what))

    def __str__(self) -> str:
        return "\n".join(f"{t:7.1f} s  {what}" for t, what in self.events)


def wait_until(
    what: str,
    check: Callable[[], Any],
    timeout_s: float = 120,
    state: Callable[[], Any] = lambda: "",
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}\n{state()}")


def tiny_llama(out: Path) -> Path:
    """A 2-layer Llama (hidden 64) with random weights, written by transformers, with
    MiniLM's tokenizer (30,522 tokens: the model's vocabulary)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=101,
        eos_token_id=102,
        tie_word_embeddings=True,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(MINILM / name, out / name)
    return out


def cpu_pack(out: Path) -> Path:
    """The turnout pack without its soft blocker of V2 on the CPU platform (``cpu_platform``:
    auto keeps CPU engines on V1, as V2's kernels run interpreted there), so that the
    stage's canary may put a CPU engine on V2 as it would a GPU one."""
    shutil.copytree(Path(policies.__file__).parent / "turnout", out)
    matrix = out / "capability_matrix.yaml"
    text = matrix.read_text()
    start = text.index("  - id: cpu_platform\n")
    end = text.index("  - id: ", start + 1)
    matrix.write_text(text[:start] + text[end:])
    return out


def split_ids(pack_dir: Path) -> tuple[str, str]:
    """A deployment id the stage's canary takes at 50 %, and one it leaves out up to 75 %."""
    pack = load_pack(str(pack_dir))
    canary = baseline = None
    for i in range(200):
        did = f"engine-{i}"
        config = from_spec(
            {"architecture": "LlamaForCausalLM", "deployment_id": did, "platform": "cpu"}
        )

        def included(pct: int, config: Any = config) -> bool:
            snap = CanarySnapshot(cohorts={STAGE: CohortState(True, pct)})
            d = decide(config, pack=pack, canaries=snap)
            return d.canary is not None and d.canary.included

        if canary is None and included(50):
            canary = did
        elif baseline is None and not included(75):
            baseline = did
        if canary and baseline:
            return canary, baseline
    raise AssertionError("no split found")


@dataclass
class Fleet:
    service: LiveService
    prometheus: PrometheusServer
    alertmanager: Any
    tokens: dict[str, str]
    pack: Path
    model: Path
    tmp: Path
    timeline: Timeline
    engines: dict[str, Server] = field(default_factory=dict)

    def h(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def api(
        self,
        method: str,
        path: str,
        role: str = "viewer",
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        return httpx.request(
            method,
            self.service.url + "/api/v1" + path,
            headers={**self.h(role), **(headers or {})},
            timeout=30,
            **kw,
        )

    def turnout(self, *args: str) -> str:
        """A ``turnout`` command from the operator's laptop: the remote CLI, with the
        service's URL and the operator's token (the identity the audit log records)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
        env |= {"TURNOUT_URL": self.service.url, "TURNOUT_TOKEN": self.tokens["operator"]}
        env["XDG_CONFIG_HOME"] = str(self.tmp / "config")
        done = subprocess.run(
            [sys.executable, "-c", "from turnout.oracle.cli import main; main()", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout.strip()

    def set_alert_threshold(self, seconds: float) -> None:
        """Write the canary's TTFT alert rule with ``seconds`` and have Prometheus reload."""
        (self.tmp / "rules.yml").write_text(ALERT_RULES.format(threshold=seconds))
        self.prometheus.proc.send_signal(signal.SIGHUP)

    def start_engine(self, name: str, deployment_id: str, *args: str) -> Server:
        server = start_server(
            self.model,
            self.tmp / f"{name}.log",
            "--max-model-len",
            "256",
            "--served-model-name",
            "tiny",
            "--pack",
            str(self.pack),
            *args,
            env={
                "TURNOUT_URL": self.service.url,
                "TURNOUT_TOKEN": self.tokens["engine"],
                "TURNOUT_CACHE_DIR": str(self.tmp / f"cache-{name}"),
                "TURNOUT_DEPLOYMENT_ID": deployment_id,
            },
        )
        self.engines[name] = server
        return server


def complete(server: Server, max_tokens: int = 8) -> None:
    httpx.post(
        server.base_url + "/completions",
        json={
            "model": "tiny",
            "prompt": "the rollout of",
            "max_tokens": max_tokens,
            "ignore_eos": True,
        },
        timeout=300,
    ).raise_for_status()


def complete_quietly(server: Server, max_tokens: int) -> None:
    """:func:`complete`, a request the drain aborts included."""
    with contextlib.suppress(httpx.HTTPError):
        complete(server, max_tokens)


@pytest.fixture
def db_url(pg_schema_url: str) -> str:
    """PostgreSQL only here (the module docstring says why)."""
    return pg_schema_url


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    skip_under_a_shifted_clock()  # before any process starts
    timeline = Timeline()
    tokens = make_tokens(db_url)
    pack = cpu_pack(tmp_path / "pack")
    receiver_token = "am-" + hashlib.sha256(tmp_path.name.encode()).hexdigest()[:24]
    receivers = tmp_path / "receivers.yaml"
    receivers.write_text(
        "receivers:\n"
        "  - name: sre\n"
        f"    token_sha256: {hashlib.sha256(receiver_token.encode()).hexdigest()}\n"
        "    rules:\n"
        "      - match: {severity: page}\n"
        "        action: kill_switch\n"
    )
    service_port, am_port = free_port(), free_port()
    (tmp_path / "am").mkdir()
    am_config = tmp_path / "am" / "alertmanager.yml"
    am_config.write_text(
        f"""
route:
  receiver: turnout
  group_by: [alertname, turnout_stage]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: turnout
    webhook_configs:
      - url: http://127.0.0.1:{service_port}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization:
            credentials: {receiver_token}
"""
    )
    assert ALERTMANAGER is not None
    am_log = tmp_path / "alertmanager.log"
    # Every process is stopped whatever fails later in this setup (a model that cannot be
    # written left the service, Prometheus and Alertmanager running after the run).
    with contextlib.ExitStack() as stop:
        alertmanager = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={am_config}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            stdout=open(am_log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        stop.callback(alertmanager.wait, 10)
        stop.callback(alertmanager.terminate)
        rules = tmp_path / "rules.yml"
        rules.write_text("groups: []\n")  # the alert comes once the healthy TTFT is measured
        (tmp_path / "prom").mkdir()
        prometheus = start_prometheus(
            tmp_path / "prom",
            f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{rules}"]
alerting:
  alertmanagers:
    - static_configs: [{{targets: ["127.0.0.1:{am_port}"]}}]
scrape_configs:
  - job_name: engines
    http_sd_configs:
      - url: http://127.0.0.1:{service_port}/api/v1/prometheus/targets
        refresh_interval: 1s
        authorization: {{type: Bearer, credentials: {tokens["viewer"]}}}
""",
        )
        stop.callback(prometheus.stop)
        service = start_service(
            db_url,
            tmp_path / "service.log",
            port=service_port,
            env={
                "TURNOUT_PROMETHEUS_URL": prometheus.url,
                "TURNOUT_TICK_S": "1",
                "TURNOUT_ALERTMANAGER_CONFIG": str(receivers),
                "TURNOUT_PACK": str(pack),
            },
        )
        stop.callback(service.stop)
        stop.callback(lambda: print("\n" + str(timeline)))
        model = tiny_llama(tmp_path / "tiny-llama")
        made = Fleet(service, prometheus, alertmanager, tokens, pack, model, tmp_path, timeline)
        stop.callback(lambda: [engine.stop() for engine in made.engines.values()])
        yield made


def _gate_query() -> str:
    """The ramp gate's query: the stage's canary p95 TTFT (``$stage``, ``$window``)."""
    return (
        "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{turnout_stage="$stage",turnout_cohort="canary"}[$window])))'
    )


def test_a_staged_rollout_gated_by_prometheus_and_paged_by_alertmanager(fleet: Fleet) -> None:
    say = fleet.timeline.say
    canary_id, baseline_id = split_ids(fleet.pack)
    for family in ("llama", "mistral"):
        got = fleet.api(
            "POST",
            "/evidence",
            "operator",
            json={"family": family, "suite": "tests/parity", "result": "pass"},
        )
        assert got.status_code == 201, got.text
    say("CI pushed green parity evidence for llama and mistral (operator token)")

    # -- the stage's canary on 50 %, then the engines decide at start-up ---------------------
    said = fleet.turnout(
        "canary", "enable", STAGE, "--percentage", "50", "--reason", "V2 canary for dense Llama"
    )
    say(f"operator (laptop): turnout canary enable {STAGE} --percentage 50 → {said}")
    with ThreadPoolExecutor(2) as starting:  # two model loads at once
        canary_start = starting.submit(
            fleet.start_engine, "canary", canary_id, "--max-num-seqs", "1", "--drain-timeout", "2"
        )
        baseline_start = starting.submit(fleet.start_engine, "baseline", baseline_id)
        canary, baseline = canary_start.result(), baseline_start.result()
    runners = {
        name: httpx.get(e.base_url + "/models", timeout=10).headers["x-turnout-runner"]
        for name, e in fleet.engines.items()
    }
    assert runners == {"canary": "v2", "baseline": "v1"}
    say(f"engines up: canary {canary_id} on V2, baseline {baseline_id} on V1")

    # -- 1. Prometheus finds both through the service's HTTP SD ----------------------------
    found = wait_until(
        "Prometheus scrapes both engines",
        lambda: (
            len(fleet.prometheus.query('up{job="engines"} == 1')) == 2
            and fleet.prometheus.query('up{job="engines"}')
        ),
    )
    labels = {r["metric"]["turnout_cohort"]: r["metric"] for r in found}  # type: ignore[index]
    assert labels["canary"]["turnout_runner"] == "v2"
    assert labels["baseline"]["turnout_runner"] == "v1"
    assert {m["turnout_stage"] for m in labels.values()} == {STAGE}
    assert {m["turnout_family"] for m in labels.values()} == {"llama"}
    assert labels["canary"]["turnout_deployment"] == canary_id
    say("Prometheus discovered both engines (turnout_stage, turnout_cohort, turnout_runner...)")

    # -- healthy traffic; its p95 TTFT sets the gate (3x, at least 1 s) -----------------------
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            for engine in (canary, baseline):
                with contextlib.suppress(httpx.HTTPError):
                    complete(engine)
            time.sleep(0.2)

    feeder = threading.Thread(target=traffic, daemon=True)
    feeder.start()
    rendered = _gate_query().replace("$stage", STAGE).replace("$window", "30s")
    healthy = wait_until(
        "the canary's TTFT is in Prometheus",
        lambda: fleet.prometheus.query(rendered + " > 0"),
        timeout_s=120,
    )
    healthy_s = float(healthy[0]["value"][1])  # type: ignore[index]
    threshold = round(max(3 * healthy_s, 1.0), 2)
    say(f"healthy canary p95 TTFT {healthy_s:.3f} s: the gate and the alert use {threshold} s")
    fleet.set_alert_threshold(threshold)

    # -- 2. a ramp gated on it steps while the canary is healthy -----------------------------
    gates_file = fleet.tmp / "gates.yaml"
    gates_file.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "canary_ttft_p95",
                    "query": _gate_query(),
                    "comparison": "<=",
                    "threshold": threshold,
                    "window": "30s",
                }
            ]
        )
    )
    said = fleet.turnout(
        "canary", "ramp", "start", STAGE,
        "--steps", "50:5s,75:1h,100:1h",
        "--promql", str(gates_file), "--no-health-reports", "--max-inconclusive-rounds", "1000",
        "--on-failure", "pause",
        "--reason", "V2 for dense Llama, gated on the canary's TTFT",
    )  # fmt: skip
    ramp_id = fleet.api("GET", f"/ramps?cohort={STAGE}&live=true").json()[0]["id"]
    say(f"operator (laptop): turnout canary ramp start {STAGE} --steps 50:5s,75:1h,100:1h "
        f"--promql gates.yaml → {said}")  # fmt: skip

    def ramp() -> dict[str, Any]:
        got: dict[str, Any] = fleet.api("GET", f"/ramps/{ramp_id}").json()
        return got

    try:
        stepped = wait_until(
            "the ramp steps to 75 %",
            lambda: (r := ramp())["percentage"] == 75 and r,
            timeout_s=120,
            state=ramp,
        )
        passed = next(g for g in stepped["last_gates"] if g["gate"] == "promql:canary_ttft_p95")
        say(f"gate passed (canary p95 TTFT {passed['figures']['value']:.3f} s): ramp at 75 %")

        # -- 3. latency on the canary: the gate fails, the ramp pauses, Alertmanager pages ---
        flood = ThreadPoolExecutor(8)
        for _ in range(8):
            flood.submit(complete_quietly, canary, 24)
        say("8 requests queued on the canary (--max-num-seqs 1): its TTFT climbs")
        wait_until("the ramp pauses", lambda: ramp()["state"] == "paused", 240, ramp)
        failed = next(g for g in ramp()["last_gates"] if g["gate"] == "promql:canary_ttft_p95")
        assert failed["status"] == "fail" and failed["figures"]["value"] > threshold
        say(f"gate failed (canary p95 TTFT {failed['figures']['value']:.2f} s): ramp paused")
        wait_until(
            "Alertmanager's page engages the kill switch",
            lambda: fleet.api("GET", "/kill-switch").json().get("engaged"),
            timeout_s=240,
            state=lambda: fleet.api("GET", "/alertmanager/receipts").text[:2000],
        )
        say("alert CanaryTTFTHigh: Prometheus → Alertmanager → receiver sre: kill switch engaged")
    finally:
        stop.set()

    # -- 4. the canary is on an old decision until it restarts ------------------------------
    stale = wait_until(
        "the canary is listed as stale",
        lambda: fleet.api("GET", "/engines?stale=true").json()["engines"],
        timeout_s=30,
    )
    assert [(e["deployment_id"], e["runner"], e["expected_runner"]) for e in stale] == [
        (canary_id, "v2", "v1")
    ]
    say(f"stale engines: {stale[0]['address']} ({canary_id}) runs V2, its next start V1")
    canary.terminate()  # the drain aborts the queued requests after --drain-timeout
    assert canary.proc.wait(120) == 0
    flood.shutdown(wait=False, cancel_futures=True)
    restarted = fleet.start_engine("canary-restarted", canary_id, "--max-num-seqs", "1")
    assert httpx.get(restarted.base_url + "/models").headers["x-turnout-runner"] == "v1"
    after = fleet.api("GET", "/engines").json()
    assert after["num_stale"] == 0 and after["num_engines"] == 2
    say("canary restarted on V1: no engine left on an old decision")
    feeder.join(timeout=300)

    # -- 5. the audit log: every step with its actor ----------------------------------------
    entries = fleet.api("GET", "/audit?limit=200").json()
    by_action: dict[str, set[str]] = {}
    for e in entries:
        by_action.setdefault(e["action"], set()).add(e["actor"])
    operator = next(iter(by_action["ramp.start"]))
    assert operator.startswith("operator (token "), by_action
    assert by_action["canary.flip"] >= {operator}
    assert by_action["ramp.step"] == {"ramp"}
    assert by_action["ramp.pause"] == {"ramp"}
    assert by_action["ramp.gate"] == {"ramp"}
    assert by_action["kill_switch.set"] == {"alertmanager:sre"}
    assert by_action["engines.restart_required"] == {"service"}
    say(
        "audit: "
        + "; ".join(f"{a} by {', '.join(sorted(s))}" for a, s in sorted(by_action.items()))
    )
