"""Schemathesis fuzzes every operation of the OpenAPI document against a running service (with
an admin token and the demo fleet loaded): no input may produce a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from service_helpers import LiveService, make_tokens, start_service

TOKENS: dict[str, str] = {}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    root = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{root / 'fuzz.db'}"
    TOKENS.update(make_tokens(url))
    svc = start_service(url, root / "svc.log", demo=True)
    yield svc
    svc.stop()
    assert "Traceback" not in svc.log.read_text(), svc.log.read_text()[-5000:]


@pytest.fixture(scope="module")
def api_schema(service: LiveService) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{service.url}/api/v1/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_no_server_errors(case: schemathesis.Case, service: LiveService) -> None:
    response = case.call(base_url=service.url,
                         headers={"Authorization": f"Bearer {TOKENS['admin']}"}, timeout=30)
    assert response.status_code < 500, (case.method, case.formatted_path, response.text)
