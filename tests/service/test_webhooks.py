"""Webhooks end to end: a real receiver on 127.0.0.2 (which the tests'
DRAFTYARD_WEBHOOK_ALLOWED_HOSTS allows) that fails the first two deliveries, and an API
restart while an event waits in the outbox: every event arrives, signed, exactly once per
event id."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time

import pytest
from sqlalchemy import text

from tests.conftest import REDIS_DBS, wait_for
from tests.service.receiver import Receiver
from tests.service.stack import running


@pytest.fixture
def stack():
    with running("hooks", REDIS_DBS[1], {"DRAFTYARD_WEBHOOK_BACKOFF_S": "0.5",
                                         "DRAFTYARD_WEBHOOK_POLL_S": "0.2",
                                         "DRAFTYARD_CPU_SLOTS": "3"},
                 workers={"hooknode": None}) as st:
        yield st




def _member_token(api) -> str:
    import uuid

    r = api.post("/v1/users", {"name": f"nosy-{uuid.uuid4().hex[:6]}", "role": "member"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _submit(c, params: dict) -> str:
    """A probe that skips importing torch (its facts are not what is checked here): it ends
    in ~0.2 s of CPU, not ~3 s, and `sleep_s` is the whole of its time."""
    r = c.post("/v1/jobs", json={"type": "probe", "params": {**params, "import_torch": False}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_register_validate_list_delete(api, member):
    c, o = member.c, api.as_(_member_token(api)).c
    r = c.post("/v1/webhooks", json={"url": "ftp://x", "events": ["job.failed"]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "url", r.text
    r = c.post("/v1/webhooks", json={"url": "http://127.0.0.2:9/h",
                                     "events": ["job.failed", "job.exploded"]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "events[1]", r.text
    r = c.post("/v1/webhooks", json={"url": "http://127.0.0.2:9/h", "events": []})
    assert r.status_code == 422 and r.json()["error"]["param"] == "events", r.text
    r = c.post("/v1/webhooks", json={"url": "http://127.0.0.2:9/h",
                                     "events": ["job.failed", "run.succeeded"]})
    assert r.status_code == 201, r.text
    hook = r.json()
    assert hook["secret"].startswith("whsec_") and hook["events"] == ["job.failed",
                                                                      "run.succeeded"]
    listed = c.get("/v1/webhooks").json()["data"]
    assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
    assert "secret" not in c.get(f"/v1/webhooks/{hook['id']}").json()
    assert o.get(f"/v1/webhooks/{hook['id']}").status_code == 404  # private
    assert o.delete(f"/v1/webhooks/{hook['id']}").status_code == 404
    assert o.get("/v1/webhooks").json()["data"] == []
    assert c.delete(f"/v1/webhooks/{hook['id']}").status_code == 204
    assert c.get("/v1/webhooks").json()["data"] == []
    assert c.get(f"/v1/webhooks/{hook['id']}/deliveries").status_code == 404


def test_deliveries_survive_failures_and_an_api_restart(stack):
    tok = stack.user("hookuser")
    with Receiver(fail_first=2) as rx:
        with stack.client(tok) as c:
            hook = c.post("/v1/webhooks", json={"url": rx.url, "events": [
                "job.succeeded", "job.failed", "job.cancelled"]}).json()
            ok = _submit(c, params={})
            bad = _submit(c, params={"fail": True})
            # Ends while the API is down: its event waits in the outbox (the worker wrote it).
            # The API is killed ~1.1 s after this submit (measured at load 3, printed below).
            late = _submit(c, params={"sleep_s": 5})
            t_sub = time.time()
        wait_for(lambda: len(rx.snapshot()) >= 2, 60, 0.1, "the first two deliveries")
        assert [r["answered"] for r in rx.snapshot()[:2]] == [500, 500]
        api = stack.procs[0]
        t_late = time.time()
        api.kill()
        print(f"the API killed {t_late - t_sub:.2f} s after the late job (5 s) was submitted")
        stack.procs.remove(api)
        seen_down = len(rx.snapshot())

        def late_outbox():
            with stack.engine().connect() as db:
                return db.execute(text(
                    "SELECT j.status, d.status FROM jobs j JOIN webhook_deliveries d "
                    "ON d.body LIKE '%' || j.id || '%' WHERE j.id = :j"), {"j": late}).first()
        row = wait_for(late_outbox, 60, 0.3, "the late job's event in the outbox")
        assert row == ("succeeded", "pending")
        # Nothing sends while the API is down: wait until every pending delivery of the hook
        # is due (its backoff is over, so a running sender would have sent it), then see
        # that none was sent and none was tried.
        def due():
            with stack.engine().connect() as db:
                return db.execute(text(
                    "SELECT count(*) > 0 AND bool_and(next_at <= now()), sum(attempts) "
                    "FROM webhook_deliveries WHERE webhook_id = :h AND status = 'pending'"),
                    {"h": hook["id"]}).one()
        tried = wait_for(lambda: (r := due())[0] and r, 30, 0.2, "the pending deliveries due")[1]
        assert len(rx.snapshot()) == seen_down
        assert due()[1] == tried
        stack.start_api()
        with stack.client(tok) as c:
            gone = _submit(c, params={"sleep_s": 60})
            wait_for(lambda: c.get(f"/v1/jobs/{gone}").json()["status"] == "running", 60, 0.2)
            assert c.post(f"/v1/jobs/{gone}/cancel").status_code == 200

            def all_delivered():
                d = c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
                return len(d) == 4 and all(x["status"] == "delivered" for x in d) and d
            log = wait_for(all_delivered, 90, 0.3, "every delivery")
    reqs = rx.snapshot()
    secret = hook["secret"].encode()
    for r in reqs:  # every attempt, failed or not, carries a valid signature
        want = "sha256=" + hmac.new(secret, r["body"], hashlib.sha256).hexdigest()
        assert hmac.compare_digest(r["headers"]["X-Draftyard-Signature"], want)
        assert json.loads(r["body"])["id"] == r["headers"]["X-Draftyard-Event-Id"]
    accepted: dict[str, dict] = {}
    for r in reqs:
        if r["answered"] == 200:
            eid = r["headers"]["X-Draftyard-Event-Id"]
            assert eid not in accepted, f"event {eid} delivered twice"
            accepted[eid] = json.loads(r["body"])
    got = sorted((e["type"], e["data"]["job"]["id"]) for e in accepted.values())
    assert got == sorted([("job.succeeded", ok), ("job.failed", bad), ("job.succeeded", late),
                          ("job.cancelled", gone)])
    # The two refused deliveries were retried with the same event id and body.
    first_two = {r["headers"]["X-Draftyard-Event-Id"]: r["body"] for r in reqs[:2]}
    for eid, body in first_two.items():
        assert eid in accepted and json.dumps(accepted[eid], sort_keys=True) == \
            json.dumps(json.loads(body), sort_keys=True)
    by_event = {x["event_id"]: x for x in log}
    assert all(by_event[e]["attempts"] >= 2 for e in first_two)
    assert all(x["last_status_code"] == 200 and x["delivered_at"] for x in log)


def test_a_payload_shows_the_job_as_its_owner_reads_it(member, worker, home):
    """A member's job.failed payload (and its delivery log) is the member's GET /v1/jobs/{id}:
    the same read model, server folders as labels (the ingest's source is stored as the
    server's path), the API's timestamps."""
    import uuid

    name = f"hooked-{uuid.uuid4().hex[:6]}.jsonl"
    (home / "data" / name).write_text("not json\n" * 4)  # fails: no record has a known shape
    with Receiver() as rx:
        c = member.c
        hook = c.post("/v1/webhooks", json={"url": rx.url, "events": ["job.failed"]}).json()
        job = member.submit(type="ingest", inputs={"source": {"path": name}})
        wait_for(rx.snapshot, 120, 0.2, "the job.failed event")
        sent = rx.snapshot()[0]["body"].decode()
    event = json.loads(sent)
    read = member.job(job["id"])
    assert read["status"] == "failed" and read["inputs"]["source"]["path"] == f"data:{name}"
    assert event["type"] == "job.failed" and event["data"]["job"] == read, (event, read)
    for root in {str(home), str(home.resolve())}:
        assert root not in sent, sent
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", event["created_at"]), event
    assert "T" in read["finished_at"] and read["finished_at"].endswith("+00:00")
    log = c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
    assert [d["payload"] for d in log] == [event]
