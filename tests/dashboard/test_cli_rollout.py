"""``turnout canary ramp …``, ``canary schedule``, ``approvals …``, ``webhook …`` through a
served database (``cli_helpers.served``), and ``turnout evidence push`` of real JUnit reports to
a running service."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import ServiceCli, served
from service_helpers import LiveService, make_tokens, start_service

from turnout.dashboard.junit import JUnitError, parse_junit, read_junit
from turnout.dashboard.services import Services
from turnout.dashboard.store import audit, canaries, webhooks

Run = ServiceCli


@pytest.fixture
def run(tmp_path: Path) -> Iterator[ServiceCli]:
    """A command as the served database's operator token (``token=`` for another)."""
    with served(tmp_path) as service_cli:
        service_cli.role = "operator"
        yield service_cli


def _services(run: Run) -> Services:
    return run.services


def test_a_ramp_from_the_command_line(run: Run) -> None:
    code, out = run(
        "canary",
        "ramp",
        "start",
        "llama",
        "--steps",
        "10,25:1h,50,100",
        "--bake",
        "30m",
        "--min-engines",
        "2",
        "--reason",
        "parity green",
    )
    assert code == 0, out
    assert "llama: the family's first rollout stage is llama-mistral-dense" in out
    assert "(10% → 25% → 50% → 100%): active at 10% (step 1/4), next step" in out
    with _services(run).db.read_session() as s:
        state = canaries.read_state(session=s).cohorts["llama-mistral-dense"]
        [entry] = audit.list_entries(session=s, limit=1)
    assert state[:2] == (True, 10) and entry.action == "ramp.start"
    code, out = run("canary", "ramp", "status")
    assert code == 0 and "ramp 1 of llama-mistral-dense" in out
    code, out = run("canary", "ramp", "start", "llama", "--steps", "10,100", "--reason", "x")
    assert code == 1 and "has a live ramp already" in out
    code, out = run("canary", "ramp", "cancel", "llama-mistral-dense", "--reason", "enough")
    assert code == 0 and "cancelled: enough" in out
    code, out = run("canary", "ramp", "resume", "llama-mistral-dense", "--reason", "x")
    assert code == 2 and "no live ramp" in out


def test_a_paused_ramp_says_it_waits_for_a_resume(run: Run) -> None:
    from turnout.dashboard.store import ramps

    assert run("canary", "ramp", "start", "llama", "--steps", "10,100", "--reason", "go")[0] == 0
    with _services(run).db.write_session() as s:
        canary, ramp = ramps.lock(s, 1)
        ramps.fail(
            session=s,
            canary=canary,
            ramp=ramp,
            now=dt.datetime.now(dt.UTC),
            gates=[],
            why="gate v2_error_rate: v2 5.0% vs v1 0.0% (max ratio 2)",
        )
        s.commit()
    code, out = run("canary", "ramp", "status")
    assert (
        code == 0
        and "paused at 10% (step 1/2); stays there until resumed (turnout canary "
        "ramp resume llama-mistral-dense --reason …)"
        in out
    ), out
    assert "next step" not in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--steps", "10,5"), "does not rise above"),
        (("--steps", "ten"), "is not a share"),
        (("--steps", "10:forever"), "--steps '10:forever'"),
        (("--steps", "10", "--bake", "soon"), "--bake"),
        (("--steps", "10", "--on-failure", "panic"), "use pause or rollback"),
        (("--steps", "10", "--evidence-max-age", "1s"), "gates.evidence_max_age_s"),
    ],
)
def test_a_bad_ramp_is_bad_input(run: Run, args: tuple[str, ...], says: str) -> None:
    code, out = run("canary", "ramp", "start", "qwen3-canary", *args, "--reason", "r")
    assert code == 2 and says in out, out


def test_approvals_need_another_user(tmp_path: Path) -> None:
    with served(tmp_path, require_approval=True) as service_cli:
        _approvals_need_another_user(service_cli)


def _approvals_need_another_user(run: Run) -> None:
    # The approver is the token's holder: the shell's user name changes nothing.
    alice = run.add_token("alice")
    bob = run.add_token("bob")
    as_alice = {"token": alice, "env": {"USER": "bob", "LOGNAME": "bob"}}
    code, out = run(
        "canary",
        "enable",
        "quantized",
        "--percentage",
        "10",
        "--reason",
        "go",
        **as_alice,  # type: ignore[arg-type]
    )
    assert code == 0 and "waiting for another operator's approval (flip 1" in out, out
    code, out = run("approvals", "list")
    assert "flip 1  quantized: enable at 10 % now  (by alice (token 5)" in out, out
    code, out = run("approvals", "approve", "flip", "1", "--reason", "me", **as_alice)  # type: ignore[arg-type]
    assert code == 2 and "another operator must approve it" in out
    code, out = run("approvals", "approve", "flip", "1", "--reason", "checked", token=bob)
    assert code == 0 and "flip 1: approved" in out
    with _services(run).db.read_session() as s:
        assert canaries.read_state(session=s).cohorts["quantized"][:2] == (True, 10)
    code, out = run(
        "canary", "ramp", "start", "pooling", "--steps", "50,100", "--reason", "r", token=alice
    )
    assert code == 0 and "waiting for another operator (turnout approvals approve ramp 1" in out
    code, out = run(
        "canary", "schedule", "pooling", "--in", "2h", "--percentage", "25", "--reason", "later"
    )
    assert (
        code == 0
        and "pooling enable 25% at" in out
        and "(pending_approval; waiting for "
        "another operator (turnout approvals approve flip 2 --reason …))"
        in out
    ), out
    code, out = run("approvals", "reject", "ramp", "1", "--reason", "withdrawn", token=alice)
    assert code == 0 and "ramp 1: rejected" in out
    assert run("approvals", "approve", "rampx", "1", "--reason", "r")[0] == 2


def test_bake_times_of_zero_and_their_errors_speak_of_bake_times(run: Run) -> None:
    """A bake of 0 is a bake time the API takes (0..30 days): the command refused it, saying
    "a token lives more than 0 s and at most 3660 days"."""
    code, out = run(
        "canary",
        "ramp",
        "start",
        "qwen3-canary",
        "--steps",
        "10:0s,50",
        "--bake",
        "0m",
        "--reason",
        "r",
    )
    assert code == 0 and "(10% → 50%): active at 10% (step 1/2)" in out, out
    for args, says in [
        (("--bake", "31d"), "steps[0].bake_s: Input should be less than or equal to 2592000"),
        (
            ("--bake", "soon"),
            "--bake 'soon' is not a duration: a number and a unit: s, m, h, d or w (30d, 12h, 90m)",
        ),
    ]:
        code, out = run("canary", "ramp", "start", "llama", "--steps", "10", *args, "--reason", "r")
        assert code in (1, 2) and says in out and "token" not in out, out
    code, out = run("canary", "schedule", "pooling", "--in", "0s", "--reason", "now?")
    assert code == 2 and "--in '0s': a flip is scheduled more than 0 s ahead" in out, out
    assert "token" not in out


def test_a_scheduled_flip_from_the_command_line(run: Run) -> None:
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    code, out = run(
        "canary", "schedule", "qwen3", "--disable", "--at", when + "Z", "--reason", "freeze"
    )
    assert (
        code == 0 and f"qwen3-canary disable at {when.replace('T', ' ')} UTC (scheduled)" in out
    ), out
    code, out = run("canary", "schedule", "qwen3", "--at", "tomorrow", "--reason", "x")
    assert code == 2 and "is not a time" in out
    code, out = run("canary", "schedule", "pooling", "--in", "3h", "--reason", "later")
    assert code == 0 and "pooling enable at" in out and "(scheduled)" in out
    assert run("canary", "schedule", "pooling", "--reason", "when?")[0] == 2


def test_webhooks_from_the_command_line(run: Run) -> None:
    run.role = "admin"  # webhooks are an admin's
    code, out = run(
        "webhook",
        "add",
        "https://hooks.example.com/t",
        "-k",
        "flip",
        "-k",
        "gate_failure",
        "--description",
        "on-call",
    )
    assert code == 0 and out.splitlines()[0].startswith("whsec_")
    code, out = run("webhook", "add", "ftp://x", "-k", "flip")
    assert code == 2 and "not an http" in out
    run("canary", "enable", "pooling", "--reason", "go")
    code, out = run("webhook", "list")
    assert "https://hooks.example.com/t  flip, gate_failure  on-call" in out
    assert "outbox: 1 pending, 0 delivered, 0 dead" in out
    code, out = run("webhook", "outbox")
    assert code == 0 and "pending" in out and "flip" in out
    assert run("webhook", "retry", "1")[0] == 1  # not dead: a conflict
    code, out = run("webhook", "remove", "1", "--reason", "moved")
    assert code == 0 and "removed" in out
    with _services(run).db.read_session() as s:
        assert webhooks.outbox_counts(session=s)["dead"] == 1
    code, out = run("webhook", "retry", "1")
    assert code == 1 and "subscription was removed" in out


PASSING = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.parity.test_greedy" name="test_llama[v1]"/>
<testcase classname="tests.parity.test_greedy" name="test_llama[v2]"/>
<testcase classname="tests.parity.test_greedy" name="test_gpu"><skipped message="no CUDA"/></testcase>
</testsuite></testsuites>"""
FAILING = b"""<testsuite name="parity" tests="99" failures="0">
<testcase classname="tests.parity.test_greedy" name="test_llama[v1]"/>
<testcase classname="tests.parity.test_greedy" name="test_llama[v2]"><failure message="diverged at token 17"/></testcase>
<testcase classname="tests.parity.test_logprobs" name="test_prompt"><error message="OOM"/></testcase>
</testsuite>"""


def test_junit_counts_come_from_the_test_cases() -> None:
    ok = parse_junit(PASSING)
    assert (ok.result, ok.num_tests, ok.num_skipped, ok.suites) == ("pass", 3, 1, ("pytest",))
    bad = parse_junit(FAILING)  # its tests="99" failures="0" are wrong: the cases count
    assert (bad.result, bad.num_tests, bad.num_failures, bad.num_errors) == ("fail", 3, 1, 1)
    assert bad.failed == (
        "tests.parity.test_greedy::test_llama[v2]",
        "tests.parity.test_logprobs::test_prompt",
    )
    assert bad.summary() == "1 failed, 1 errored of 3 tests"
    assert parse_junit(b"<testsuites/>").result == "fail"  # nothing ran
    skipped_only = b'<testsuite><testcase classname="t" name="a"><skipped/></testcase></testsuite>'
    assert parse_junit(skipped_only).result == "fail"  # before: a pass, with no test passed
    for text, says in [(b"<html>", "not XML"), (b"<report/>", "not a JUnit report")]:
        with pytest.raises(JUnitError, match=says):
            parse_junit(text)


def _push(
    svc: LiveService, token: str, report: Path, family: str = "qwen3"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from turnout.oracle.cli import main; main()",
            "evidence",
            "push",
            "--family",
            family,
            "--junit",
            str(report),
            "--url",
            svc.url,
        ],
        env={
            "TURNOUT_TOKEN": token,
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        },
        capture_output=True,
        text=True,
    )


def test_evidence_push_sends_a_junit_report(tmp_path: Path, live: list[LiveService]) -> None:
    import httpx

    url = f"sqlite:///{tmp_path / 'push.db'}"
    token = make_tokens(url)["operator"]
    svc = start_service(url, tmp_path / "svc.log")
    live.append(svc)
    (tmp_path / "ok.xml").write_bytes(PASSING)
    (tmp_path / "bad.xml").write_bytes(FAILING)
    (tmp_path / "junk.xml").write_bytes(b"\x00\x01")
    done = _push(svc, token, tmp_path / "ok.xml")
    assert done.returncode == 0, done.stderr
    assert "qwen3: pass (1 skipped of 3 tests) recorded as evidence 1" in done.stdout
    done = _push(svc, token, tmp_path / "bad.xml", "llama")
    assert done.returncode == 0 and "llama: fail (1 failed, 1 errored of 3 tests)" in done.stdout
    rows = httpx.get(
        svc.url + "/api/v1/evidence", headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert [(r["family"], r["result"], r["num_failures"], r["suite"]) for r in rows] == [
        ("llama", "fail", 1, "parity"),
        ("qwen3", "pass", 0, "pytest"),
    ]
    assert "tests.parity.test_greedy::test_llama[v2]" in rows[0]["details"]
    for report, family, code, says in [
        ("junk.xml", "qwen3", 2, "not XML"),
        ("missing.xml", "qwen3", 2, "No such file"),
        ("ok.xml", "Qwen3", 2, "did you mean 'qwen3'"),
    ]:
        done = _push(svc, token, tmp_path / report, family)
        assert done.returncode == code and says in done.stderr, done.stderr
    done = _push(svc, "tok_" + "x" * 43, tmp_path / "ok.xml")
    assert done.returncode == 1 and "refused the token (TURNOUT_TOKEN)" in done.stderr
    # A red run whose failed cases have long ids (parametrized tests): the details listed
    # twenty names whole, over the 10,000 characters evidence keeps, and the service refused
    # the push: the red run was never recorded and the evidence gate kept the green one.
    cases = "".join(
        f'<testcase classname="parity" name="test_long[{i}-{"p" * 900}]"><failure/></testcase>'
        for i in range(25)
    )
    (tmp_path / "long.xml").write_text(f'<testsuite name="parity">{cases}</testsuite>')
    done = _push(svc, token, tmp_path / "long.xml", "qwen3")
    assert done.returncode == 0, done.stderr
    assert "qwen3: fail (25 failed of 25 tests)" in done.stdout
    latest = httpx.get(
        svc.url + "/api/v1/evidence?family=qwen3", headers={"Authorization": f"Bearer {token}"}
    ).json()[0]
    assert latest["result"] == "fail" and "parity::test_long[0-ppp" in latest["details"]
    assert len(latest["details"]) <= 10_000


def test_a_shell_without_the_setting_follows_the_service_that_requires_approval(
    tmp_path: Path,
) -> None:
    # TURNOUT_REQUIRE_APPROVAL was read by each process alone: an operator's shell without it
    # enabled a stage at once that the service held for a second operator. The service
    # decides now; the shell's setting changes nothing.
    with served(tmp_path, require_approval=True) as run:
        code, out = run(
            "canary",
            "enable",
            "quantized",
            "--percentage",
            "10",
            "--reason",
            "go",
            env={"TURNOUT_REQUIRE_APPROVAL": "false"},
        )
        assert code == 0 and "waiting for another operator's approval" in out, out
        with run.services.db.read_session() as s:
            assert canaries.read_state(session=s).cohorts["quantized"][0] is False


def test_a_junit_report_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "report.xml"
    os.mkfifo(fifo)
    with pytest.raises(JUnitError, match="a FIFO, not a regular file"):
        read_junit(fifo)
