"""CSV exports and upgrade previews take a slot (dashboard/heavy_reads.py): over the bound in
all or per token they are answered 429 ``too_many_requests`` with Retry-After at once, and a
slot comes back when its read ends, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from service_helpers import Api

from turnout.dashboard.heavy_reads import HeavyReads, TooManyHeavyReads
from turnout.oracle.errors import ErrorCode

VIEWER = "token:1"  # role_tokens makes the viewer's token first
READS = ["/api/v1/decisions.csv?window=all", "/api/v1/upgrade-preview"]


@pytest.mark.parametrize("path", READS)
def test_a_heavy_read_over_the_bound_is_refused_at_once(api: Api, path: str) -> None:
    slots = api.services.heavy_reads
    held = [VIEWER] * slots.max_per_token  # the viewer's share, taken
    for who in held:
        slots.acquire(who)
    r = api.client.get(path, headers=api.h("viewer"))
    assert r.status_code == 429, r.text
    assert r.json()["detail"]["code"] == ErrorCode.TOO_MANY_REQUESTS
    assert "TURNOUT_MAX_HEAVY_READS_PER_TOKEN" in r.json()["detail"]["message"]
    assert r.headers["retry-after"] == "2"
    if slots.max_total > slots.running():  # another token still has room
        assert api.client.get(path, headers=api.h("operator")).status_code == 200
    others = [f"token:other-{i}" for i in range(slots.max_total - slots.running())]
    for who in others:
        slots.acquire(who)
    held += others
    r = api.client.get(path, headers=api.h("operator"))
    assert r.status_code == 429 and "TURNOUT_MAX_HEAVY_READS)" in r.json()["detail"]["message"]
    for who in held:
        slots.release(who)
    assert api.client.get(path, headers=api.h("viewer")).status_code == 200
    assert slots.running() == 0  # every read released its slot, answered or refused


def test_a_stream_releases_its_slot_when_it_ends_or_is_closed() -> None:
    slots = HeavyReads(max_total=2, max_per_token=2)

    async def lines() -> object:
        for i in range(3):
            yield f"{i}\n"

    async def run() -> None:
        slots.acquire("a")
        got = [line async for line in slots.stream("a", lines())]  # type: ignore[arg-type]
        assert got == ["0\n", "1\n", "2\n"] and slots.running() == 0
        slots.acquire("a")
        stream = slots.stream("a", lines())  # type: ignore[arg-type]
        assert await stream.__anext__() == "0\n"
        await stream.aclose()  # the client went away
        assert slots.running() == 0

    asyncio.run(run())
    with slots.slot("a"), slots.slot("a"), pytest.raises(TooManyHeavyReads):
        slots.acquire("b")
    assert slots.running() == 0
