"""Webhooks reach no internal service and read nothing back from one (SSRF).

The tests' receivers listen on 127.0.0.2, which DRAFTYARD_WEBHOOK_ALLOWED_HOSTS allows
(tests/conftest.py); every other internal address stays refused, at registration where it
can be told and at each delivery. DNS is stood in for by a resolver function passed to the
sender (the one thing a test cannot own here: a DNS server that changes its answers)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import httpx
import pytest

from tests.conftest import REDIS_DBS, wait_for
from tests.service.receiver import Receiver
from tests.service.stack import running
from tests.service.test_api_errors import _err

INTERNAL = [
    ("http://127.0.0.1:6379/", "loopback"),           # Redis on the API's box
    ("http://127.9.9.9:5432/", "loopback"),
    ("http://localhost:8000/v1/users", "the server itself"),
    ("http://[::1]:5432/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),        # IPv4-mapped IPv6
    ("http://2130706433/", "loopback"),                # decimal 127.0.0.1
    ("http://0x7f.1/", "loopback"),                    # hex
    ("http://0177.0.0.1/", "loopback"),                # octal
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://169.254.10.1/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://10.0.0.5/", "private"),
    ("http://172.16.3.4/", "private"),
    ("https://192.168.1.1/", "private"),
    ("http://[fd12:3456::1]/", "private"),             # IPv6 ULA
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0:8000/", "unspecified"),
]


@pytest.mark.parametrize("url,why", INTERNAL, ids=[u for u, _ in INTERNAL])
def test_an_internal_address_is_refused_at_registration(member, url, why):
    e = _err(member.post("/v1/webhooks", {"url": url, "events": ["job.failed"]}), 422,
             "url_not_allowed")
    assert e["param"] == "url" and why in e["message"], e
    assert "DRAFTYARD_WEBHOOK_ALLOWED_HOSTS" in e["message"], e
    assert member.get("/v1/webhooks").json()["data"] == []


def test_an_allowed_internal_receiver_and_public_names_are_accepted(member):
    for url in ("http://127.0.0.2:9/hook",       # allowed by the tests' setting
                "https://hooks.example.invalid/x"):  # not resolvable now: checked at delivery
        r = member.post("/v1/webhooks", {"url": url, "events": ["job.failed"]})
        assert r.status_code == 201, r.text
        assert member.delete(f"/v1/webhooks/{r.json()['id']}").status_code == 204


def test_a_name_that_resolves_inside_is_refused_at_registration():
    from app.core.errors import Invalid
    from app.webhooks.service import check_url

    with pytest.raises(Invalid) as e:
        check_url("http://sneaky.example/hook", resolve=lambda h, p: ["10.1.2.3"])
    assert e.value.param == "url" and "resolved to a private address" in e.value.message
    check_url("http://fine.example/hook", resolve=lambda h, p: ["93.184.216.34"])


def _row(url: str) -> SimpleNamespace:
    return SimpleNamespace(url=url, body='{"id": "evt_x"}', secret="whsec_x", event_id="evt_x",
                           event="job.failed")


def test_delivery_connects_to_the_address_it_checked_not_a_second_lookup():
    """DNS rebinding: the name answers an allowed address when checked and an internal one
    after. The sender looks it up once and connects to that address (Host and SNI keep the
    name), so the second answer is never used."""
    from app.webhooks.sender import _send

    answers = [["127.0.0.2"], ["10.9.9.9"], ["10.9.9.9"]]
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[len(asked) - 1]

    with Receiver() as rx, httpx.Client(timeout=5, trust_env=False) as client:
        code, error, final = _send(client, _row(f"http://rebind.example:{rx.port}/hook"),
                                   rebinding)
        assert (code, error) == (200, None), error
        assert asked == ["rebind.example"]
        got = rx.snapshot()
        assert len(got) == 1 and got[0]["headers"]["Host"] == f"rebind.example:{rx.port}"


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["93.184.216.34", "169.254.169.254"],
                                    ["::1"], ["10.0.0.8"]])
def test_delivery_refuses_a_name_that_now_resolves_inside(answer):
    from app.webhooks.sender import _send

    with Receiver(host="127.0.0.1") as rx, httpx.Client(timeout=5, trust_env=False) as client:
        code, error, final = _send(client, _row(f"http://moved.example:{rx.port}/hook"),
                                   lambda h, p: answer)
        assert code is None and final and error.startswith("refused: "), error
        assert rx.snapshot() == []


@pytest.fixture
def hookstack():
    with running("ssrf", REDIS_DBS[1], {"DRAFTYARD_WEBHOOK_BACKOFF_S": "0.2",
                                        "DRAFTYARD_WEBHOOK_POLL_S": "0.2",
                                        "DRAFTYARD_WEBHOOK_MAX_ATTEMPTS": "2",
                                        "DRAFTYARD_WEBHOOK_ALLOWED_HOSTS": "127.0.0.2"}) as st:
        yield st


def _cancelled_job(c: httpx.Client) -> str:
    """A job.cancelled event without a worker: a queued probe cancelled."""
    r = c.post("/v1/jobs", json={"type": "probe", "params": {"import_torch": False}})
    assert r.status_code == 201, r.text
    assert c.post(f"/v1/jobs/{r.json()['id']}/cancel").status_code == 200
    return r.json()["id"]


def _deliveries(c: httpx.Client, hook: dict, n: int) -> list[dict]:
    def done():
        d = c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
        return len(d) >= n and all(x["status"] != "pending" for x in d) and d
    return wait_for(done, 30, 0.2, f"{n} deliveries of {hook['url']} settled")


def test_delivery_checks_again_echoes_no_body_and_follows_no_redirect(hookstack):
    """Through the API's own sender: a receiver's answer is never shown (status code only),
    a redirect to an internal address is not followed, and an address allowed when the hook
    was registered but not any more is refused at delivery, at once (no retries)."""
    tok = hookstack.user(f"ssrf-{uuid.uuid4().hex[:6]}")
    secret = b"redis_version:7.2.4\r\nused_memory:123456\r\n"
    with Receiver(code=500, body=secret) as leaky, \
            Receiver(host="127.0.0.1") as internal, \
            Receiver(code=302, headers={"Location": internal.url}) as redirect, \
            Receiver() as ok, hookstack.client(tok) as c:
        hooks = [c.post("/v1/webhooks", json={"url": rx.url, "events": ["job.cancelled"]}).json()
                 for rx in (leaky, redirect, ok)]
        _cancelled_job(c)
        leak, redir, fine = (_deliveries(c, h, 1)[0] for h in hooks)
        assert fine["status"] == "delivered" and len(ok.snapshot()) == 1
        assert leak["last_status_code"] == 500 and leak["last_error"] == "HTTP 500", leak
        assert redir["last_status_code"] == 302 and redir["last_error"] == "HTTP 302", redir
        assert internal.snapshot() == []
        assert len(redirect.snapshot()) >= 1
        # The admin withdraws the allowance: the registered hook now points inside.
        hookstack.procs[0].kill()
        hookstack.procs.clear()
        hookstack.env["DRAFTYARD_WEBHOOK_ALLOWED_HOSTS"] = ""
        hookstack.start_api()
        with hookstack.client(tok) as c2:
            _cancelled_job(c2)
            d = _deliveries(c2, hooks[2], 2)[0]
        assert d["status"] == "failed" and d["attempts"] == 1, d
        assert d["last_error"].startswith("refused: ") and "loopback" in d["last_error"], d
        assert len(ok.snapshot()) == 1
