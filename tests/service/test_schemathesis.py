"""schemathesis over `/openapi.json`: every operation, cases generated from its
schema (valid and invalid), with an admin token, against the real API: 0 server errors, and
every 4xx carries the error object. Bounded budget: MAX_EXAMPLES cases per operation
(`make test-all`; marker slow). The run prints the case count."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.service.test_api_fuzz import cleanup_created, is_json

pytestmark = pytest.mark.slow
MAX_EXAMPLES = 25
SEEN: Counter = Counter()


def _schema():
    from app.main import create_app

    # The same document the server answers at /openapi.json (checked below), built here so
    # that each operation is its own test case.
    return schemathesis.openapi.from_dict(create_app().openapi())


OPERATIONS = [f"{r.ok().method.upper()} {r.ok().path}" for r in _schema().get_all_operations()]


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nschemathesis: {sum(v for k, v in SEEN.items() if k != '5xx')} cases over "
          f"{len(SEEN) - ('5xx' in SEEN)} operations, {SEEN.get('5xx', 0)} server errors",
          file=sys.stderr)


def test_the_schema_is_the_servers(server):
    import httpx

    assert httpx.get(f"{server}/openapi.json").json() == _schema().raw_schema


@pytest.mark.parametrize("label", OPERATIONS)
def test_no_server_errors(label, api):
    method, path = label.split(" ", 1)
    op = _schema().find_operation_by_label(f"{method} {path}")
    cases = (op.as_strategy(GenerationMode.POSITIVE) | op.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def run(case):
        r = case.call(base_url=api.url, headers={"Authorization": f"Bearer {api.token}"},
                      timeout=60)
        SEEN[label] += 1
        if r.status_code >= 500:
            SEEN["5xx"] += 1
        try:
            assert r.status_code < 500, (label, r.status_code, r.text[:500])
            if r.status_code >= 400 and is_json(r):
                assert set(r.json()["error"]) == {"code", "message", "param", "details"}, r.text
        finally:
            cleanup_created(api, r)

    run()
