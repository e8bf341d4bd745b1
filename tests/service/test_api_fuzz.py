"""Never a 500 for bad input: random JSON (any shape, and objects with each endpoint's own
keys holding random values) sent to every POST endpoint, and random query strings to the
lists, answer a 4xx with the error envelope, never a 5xx or a traceback."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RUN_KEYS = ["name", "target_id", "dataset_id", "drafter", "stages", "mode",
            "chat_template_kwargs", "force", "priority", "force_plan", "plan_sample", "keep"]
KEYS = {
    "/v1/jobs": ["type", "name", "priority", "gpus", "inputs", "params", "force", "preemptible",
                 "keep"],
    "/v1/runs": RUN_KEYS,
    "/v1/plans": RUN_KEYS,
    "/v1/datasets": ["name", "path", "format"],
    "/v1/datasets/mix": ["name", "sources", "dedupe", "seed"],
    "/v1/targets": ["name", "path", "tokenizer_path", "chat_template", "chat_template_kwargs"],
    "/v1/users": ["name", "role"],
    "/v1/webhooks": ["url", "events"],
    "/v1/storage/prune": ["dry_run"],
}
# Values a well-meaning client might send in the right place, mixed with junk.
PLAUSIBLE = st.sampled_from(["probe", "generate", "prepare", "train", "dflash", "eagle3",
                             "offline", "online", "member", "admin", "auto", "sharegpt",
                             "ds_nope", "tgt_nope", "job_nope", "../../etc/passwd", "/etc",
                             "", " ", "\x00", "é" * 300])
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | PLAUSIBLE)
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(st.text(max_size=10) | PLAUSIBLE, c, max_size=4),
                      max_leaves=10)


def body_for(path: str):
    keys = KEYS[path]
    shaped = st.fixed_dictionaries({}, optional={k: VALUES for k in keys})
    nested = st.fixed_dictionaries({}, optional={
        k: st.dictionaries(st.sampled_from(["type", "dataset", "target", "job", "sources",
                                            "max_tokens", "seq_length", "lr", "gpus",
                                            "drafter", "train", "prepare", "evaluate",
                                            "dataset_id", "weight", "max_records"]),
                           VALUES, max_size=4) for k in keys})
    return st.one_of(VALUES, shaped, nested)


def _check(r, what) -> None:
    assert r.status_code < 500, (what, r.status_code, r.text[:500])
    assert r.headers.get("x-request-id"), what
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"code", "message", "param", "details"}, (what, err)
        assert isinstance(err["message"], str) and err["message"], (what, err)
        assert "Traceback" not in r.text, what


def is_json(r) -> bool:
    """Whether a response (httpx's, or schemathesis', which keeps a list per header) is JSON."""
    v = r.headers.get("content-type") or ""
    return (v[0] if isinstance(v, list) and v else str(v)).startswith("application/json")


def cleanup_created(api, r) -> None:
    """A generated body that happened to be valid made something real: take it back (a job or
    run cancelled, a webhook deleted, an upload's ingest cancelled), so no queued probe holds
    a CPU slot for the rest of the session. Also used by test_schemathesis.py."""
    if r.status_code not in (200, 201) or not is_json(r):
        return
    body = r.json()
    if not isinstance(body, dict):
        return
    rid = str(body.get("id") or "")
    if rid.startswith("job_"):
        api.post(f"/v1/jobs/{rid}/cancel")
    elif rid.startswith("run_"):
        api.post(f"/v1/runs/{rid}/cancel")
    elif rid.startswith("wh_"):
        api.delete(f"/v1/webhooks/{rid}")
    if body.get("job_id"):
        api.post(f"/v1/jobs/{body['job_id']}/cancel")


FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def _fuzz_post(api, path: str, data) -> None:
    try:
        raw = json.dumps(data, allow_nan=True)  # NaN/Infinity: not JSON, must be a 400
    except (TypeError, ValueError):
        return
    r = api.c.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    _check(r, (path, raw[:300]))
    cleanup_created(api, r)


@pytest.mark.parametrize("path", list(KEYS))
@FUZZ
@given(data=st.data())
def test_fuzz_post(api, path, data):
    _fuzz_post(api, path, data.draw(body_for(path), label="body"))


QUERY = st.dictionaries(st.sampled_from(["limit", "after", "status", "type", "owner", "run_id",
                                         "kind", "job_id", "tail", "after_seq"]),
                        st.text(max_size=12) | st.integers(-(2**70), 2**70).map(str),
                        max_size=4)


@FUZZ
@given(path=st.sampled_from(["/v1/jobs", "/v1/runs", "/v1/datasets", "/v1/artifacts",
                             "/v1/targets", "/v1/queue", "/v1/nodes", "/v1/jobs/job_x/events",
                             "/v1/jobs/job_x/logs", "/v1/runs/run_x", "/v1/artifacts/art_x"]),
       query=QUERY)
def test_fuzz_list_queries(api, path, query):
    _check(api.get(path, params=query), (path, query))
