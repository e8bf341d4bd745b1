"""Delivers the webhook outbox: at least once, with exponential backoff, driven from the DB.

Each pass claims due rows for a while (`locked_until`) in a short transaction, sends them
outside any transaction (a slow receiver must not hold a DB lock, and SQLite has one), then
records the outcome. A sender that dies between the send and the record leaves the claim to
expire and the row is sent again: receivers dedupe on `X-Draftyard-Event-Id`.

Headers: `X-Draftyard-Signature: sha256=<hex HMAC-SHA256(secret, body)>`,
`X-Draftyard-Event-Id`, `X-Draftyard-Event`, `X-Draftyard-Timestamp` (unix seconds of this
attempt; the event's own time is `created_at` in the signed body).

Each attempt resolves the URL's host once, checks every address (app/webhooks/guard.py) and
connects to the checked one, with the URL's name in `Host` and TLS SNI; redirects are not
followed (a 3xx is a failed attempt), and `last_error` says what happened in a few words,
never what the receiver answered (a member must not read an internal service's replies)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import or_, select, update

from app.core.config import get_settings
from app.core.db import db_now, unit_of_work, utcnow
from app.models import Webhook, WebhookDelivery
from app.webhooks import guard

log = logging.getLogger("draftyard.webhooks")
BATCH = 20


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_s(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones: base * 2**(attempts-1)."""
    s = get_settings()
    return min(s.webhook_backoff_max_s, s.webhook_backoff_s * 2 ** max(0, attempts - 1))


def _claim(limit: int) -> list[Any]:
    cfg = get_settings()
    with unit_of_work() as s:
        now = db_now(s)
        D = WebhookDelivery
        rows = list(s.execute(
            select(D.id, D.body, D.event_id, D.event, D.attempts, Webhook.url, Webhook.secret)
            .join(Webhook, Webhook.id == D.webhook_id)
            .where(D.status == "pending", D.next_at <= now,
                   or_(D.locked_until.is_(None), D.locked_until < now))
            .order_by(D.next_at).limit(limit).with_for_update(of=D, skip_locked=True)))
        if rows:
            s.execute(update(D).where(D.id.in_([r.id for r in rows]))
                      .values(locked_until=now + timedelta(seconds=cfg.webhook_timeout_s + 30)))
        return rows


def _send(client: httpx.Client, row,
          resolve: guard.Resolver | None = None) -> tuple[int | None, str | None, bool]:
    """(status code, error, final): `final` when retrying cannot help (a refused address)."""
    body = row.body.encode()
    headers = {"Content-Type": "application/json", "User-Agent": "draftyard-webhooks/1",
               "X-Draftyard-Signature": sign(row.secret, body),
               "X-Draftyard-Event-Id": row.event_id, "X-Draftyard-Event": row.event,
               "X-Draftyard-Timestamp": str(int(time.time()))}
    try:
        url = httpx.URL(row.url)
        ip = guard.pick(url.host, url.port or (443 if url.scheme == "https" else 80), resolve)
    except guard.Refused as e:
        return None, f"refused: {e}", True
    except (LookupError, httpx.InvalidURL) as e:
        return None, str(e)[:300], False
    headers["Host"] = url.netloc.decode("ascii")
    try:
        r = client.post(url.copy_with(host=str(ip)), content=body, headers=headers,
                        extensions={"sni_hostname": url.host}, follow_redirects=False)
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}"[:300], False
    if 200 <= r.status_code < 300:
        return r.status_code, None, False
    return r.status_code, f"HTTP {r.status_code}", False


def _record(row, code: int | None, error: str | None, final: bool = False) -> None:
    cfg = get_settings()
    now = utcnow()
    attempts = row.attempts + 1
    values: dict = {"attempts": attempts, "last_status_code": code, "last_error": error,
                    "locked_until": None}
    if error is None:
        values.update(status="delivered", delivered_at=now)
    elif final or attempts >= cfg.webhook_max_attempts:
        values.update(status="failed")
    else:
        values.update(next_at=now + timedelta(seconds=backoff_s(attempts)))
    with unit_of_work() as s:
        # attempts == what we claimed: a row another sender took over after our claim
        # expired is that sender's to record.
        s.execute(update(WebhookDelivery).where(WebhookDelivery.id == row.id,
                                                WebhookDelivery.attempts == row.attempts,
                                                WebhookDelivery.status == "pending")
                  .values(**values))


def deliver_due(client: httpx.Client | None = None, limit: int = BATCH,
                resolve: guard.Resolver | None = None) -> int:
    """One pass: send what is due. Returns how many were sent (successfully or not).
    `resolve` replaces the system's DNS lookup (tests stand in for DNS with it)."""
    own = client is None
    client = client or _client()
    try:
        rows = _claim(limit)
        for row in rows:
            code, error, final = _send(client, row, resolve)
            if error:
                log.info("webhook delivery %s (%s) failed: %s", row.id, row.event, error)
            _record(row, code, error, final)
        return len(rows)
    finally:
        if own:
            client.close()


def _client() -> httpx.Client:
    # No proxies from the environment (they would do their own DNS lookup), no redirects.
    return httpx.Client(timeout=get_settings().webhook_timeout_s, trust_env=False,
                        follow_redirects=False)


class Sender:
    """The API process's background sender thread (started and stopped by app.main)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="webhook-sender", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _loop(self) -> None:
        poll = get_settings().webhook_poll_s
        with _client() as client:
            while not self._stop.is_set():
                try:
                    busy = deliver_due(client) >= BATCH
                except Exception:  # the DB may be down; the next pass retries
                    log.exception("webhook pass failed")
                    busy = False
                if not busy:
                    self._stop.wait(poll)
