"""The service's view of the oracle: the TTL-cached canary snapshot and the cohort helpers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from turnout.dashboard import policy as policy_module
from turnout.dashboard.policy import Policy
from turnout.dashboard.store import canaries
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import NotFound, StoreError
from turnout.oracle import load_pack
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack_types import RuleInfo


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    db = Database(f"sqlite:///{tmp_path / 'p.db'}")
    db.upgrade()
    p = Policy("turnout", db, ttl_s=60.0)
    with db.write_session() as s:
        canaries.ensure_defaults(session=s, defaults=p.cohort_defaults())
        s.commit()
    return p


def test_concurrent_refreshes_read_the_store_once(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A latency spike each TTL came from every waiting request re-reading the store in turn.
    reads = []
    real = canaries.read_state

    def counting(**kw):  # type: ignore[no-untyped-def]
        reads.append(1)
        time.sleep(0.05)  # a slow store: every other request arrives while this one reads
        return real(**kw)

    monkeypatch.setattr(policy_module.canary_store, "read_state", counting)
    barrier = threading.Barrier(16)
    etags = []

    def ask() -> None:
        barrier.wait()
        etags.append(policy.snapshot().etag)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reads) == 1 and len(set(etags)) == 1 and len(etags) == 16
    policy.invalidate()
    policy.snapshot()
    assert len(reads) == 2


def test_a_read_that_spans_this_processs_own_flip_is_not_kept(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A refresh read the store, a flip of this process committed and invalidated, then the
    # refresh stored what it had read: the flip stayed hidden for a whole TTL (GET /canaries
    # answered the old version to the operator who had just flipped).
    real = canaries.read_state
    reading, release = threading.Event(), threading.Event()
    first = [True]

    def slow_first(**kw):  # type: ignore[no-untyped-def]
        state = real(**kw)
        if first[0]:
            first[0] = False
            reading.set()
            release.wait(10)  # the read is done, not yet cached
        return state

    monkeypatch.setattr(policy_module.canary_store, "read_state", slow_first)
    got: list[str] = []
    refresh = threading.Thread(target=lambda: got.append(policy.snapshot().etag))
    refresh.start()
    assert reading.wait(10)
    cohort = policy.pack.cohorts[0].id
    with policy._db.write_session() as s:
        current = canaries.get_canary(session=s, cohort=cohort)
        canaries.flip_canary(
            session=s,
            cohort=cohort,
            enabled=not current.enabled,
            reason="t",
            actor="t",
            if_version=current.version,
        )
        s.commit()
    policy.invalidate()
    release.set()
    refresh.join(10)
    with policy._db.read_session() as s:
        want = canaries.read_state(session=s).etag
    assert got == [want]  # the refresh read again rather than keep what the flip outdated
    assert policy.snapshot().etag == want


def test_cohorts_resolve_from_family_names(policy: Policy) -> None:
    pack = load_pack("turnout")
    first = next(c for c in pack.cohorts if c.families)
    assert policy.resolve_cohort(first.id) == first.id
    assert policy.resolve_cohort(first.families[0]) == first.id
    assert policy.resolve_cohort("no-such-thing") == "no-such-thing"
    labels = policy.reason_labels()
    assert labels[f"rollout.stage_off:{first.id}"].endswith(f"(stage {first.label})")
    assert all("{" not in label for label in labels.values())


def test_rule_labels_fill_their_placeholders_from_the_rule_condition(policy: Policy) -> None:
    # The fallback-reasons page showed "speculative method" with the method stripped.
    labels = policy.reason_labels()
    assert labels["ngram_speculation"] == "speculative method 'ngram'"
    assert labels["v1_mamba_cache_mode_unimplemented"] == "mamba cache mode 'align or all'"
    # A placeholder its condition cannot fill (a `not` list) is dropped with its quotes.
    assert labels["v2_speculation_with_recurrent_state"] == "speculative method with Mamba layers"


def test_a_placeholder_no_condition_fixes_is_dropped_with_its_quotes() -> None:
    rule = RuleInfo(
        "r",
        "big tensor parallel '{tensor_parallel_size}'",
        "blocks_v2",
        "hard",
        False,
        {"tensor_parallel_size": (("gt", 8),)},
        "",
        "",
    )
    assert rule.matched_label() == "big tensor parallel"


def test_rollout_position_is_the_stage_order_with_unlisted_cohorts_last(policy: Policy) -> None:
    ids = [c.id for c in load_pack("turnout").cohorts]
    assert [policy.rollout_position(c) for c in ids] == list(range(len(ids)))
    assert policy.rollout_position("left-by-an-earlier-pack") == len(ids)


def test_store_error_text_lists_the_cohorts_for_an_unknown_one(policy: Policy) -> None:
    ids = [c.id for c in load_pack("turnout").cohorts]
    text = policy.store_error_text(
        "nope", NotFound("unknown cohort 'nope'", code=ErrorCode.UNKNOWN_COHORT)
    )
    assert text.startswith("unknown cohort 'nope'") and text.endswith("cohorts: " + ", ".join(ids))
    other = StoreError("version 3 is stale", code="stale_version")
    assert policy.store_error_text("x", other) == str(other)
