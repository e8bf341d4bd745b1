"""Webhooks per user: registration, the outbox of deliveries written in the same
transaction as the state change that causes them, and the delivery log.

Events: job.succeeded|failed|cancelled|preempted and run.succeeded|failed|cancelled, sent
to the webhooks of the job's (run's) owner. A body is fixed when the event happens (it is
what is signed, and every retry sends the same bytes with the same event id)."""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import utcnow
from app.core.errors import Invalid, NotFound
from app.core.ids import new_id
from app.core.jsonresp import api_json
from app.core.paths import shown
from app.core.reads import body_of
from app.core.pagination import Page, paginate
from app.jobs.render import job_models
from app.jobs.states import TERMINAL
from app.jobs.states import JobStatus as S
from app.models import Job, Run, User, Webhook, WebhookDelivery
from app.webhooks import guard

JOB_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.preempted")
RUN_EVENTS = ("run.succeeded", "run.failed", "run.cancelled")
EVENTS = JOB_EVENTS + RUN_EVENTS
MAX_HOOKS_PER_USER = 20


def check_url(url: str, resolve: guard.Resolver | None = None) -> str:
    """The URL as both a plain parser and the sender (httpx) read it, and the address check of
    app/webhooks/guard.py: an internal address is refused here where it can be told now (a
    literal address in any form, a name that resolves to one); the sender checks again at
    each delivery."""
    bad = Invalid(f"url {url!r} must be an absolute http:// or https:// URL", param="url",
                  code="invalid_url")
    try:
        host = urlsplit(url).hostname
        if host:
            guard.check_host(host)
        parts = httpx.URL(url)
        if parts.scheme not in ("http", "https") or not parts.host or not host:
            raise bad
        guard.check_host(parts.host)
        guard.pick(parts.host, parts.port or 80, resolve)
    except guard.Refused as e:
        raise Invalid(f"url: {e}", param="url", code="url_not_allowed") from None
    except LookupError:
        pass  # not resolvable now: each delivery resolves it again
    except (httpx.InvalidURL, ValueError, TypeError):
        raise bad from None
    return url


def check_events(events: list[str]) -> list[str]:
    if not events:
        raise Invalid(f"events must name at least one of {', '.join(EVENTS)}", param="events",
                      code="invalid_events")
    for i, e in enumerate(events):
        if e not in EVENTS:
            raise Invalid(f"events[{i}] {e!r} is not an event; known: {', '.join(EVENTS)}",
                          param=f"events[{i}]", code="invalid_events")
    return sorted(set(events), key=EVENTS.index)


def create_webhook(session: Session, user: Principal, url: str,
                   events: list[str]) -> tuple[Webhook, str]:
    """The secret is returned here only; later reads never show it."""
    check_url(url)
    events = check_events(events)
    n = len(list(session.scalars(select(Webhook.id).where(Webhook.owner_id == user.id))))
    if n >= MAX_HOOKS_PER_USER:
        raise Invalid(f"a user may have at most {MAX_HOOKS_PER_USER} webhooks; delete one",
                      code="too_many_webhooks")
    secret = "whsec_" + secrets.token_hex(24)
    hook = Webhook(id=new_id("wh"), owner_id=user.id, url=url, events=events, secret=secret)
    session.add(hook)
    session.flush()
    return hook, secret


def get_webhook(session: Session, user: Principal, hook_id: str) -> Webhook:
    hook = session.get(Webhook, hook_id)
    # Another user's webhook is private: 404, as docs/API.md says of private resources.
    if hook is None or (hook.owner_id != user.id and not user.is_admin):
        raise NotFound(f"webhook {hook_id} not found", param="id")
    return hook


def list_webhooks(session: Session, user: Principal, page: Page):
    return paginate(session, select(Webhook).where(Webhook.owner_id == user.id), Webhook.id,
                    page)


def delete_webhook(session: Session, user: Principal, hook_id: str) -> None:
    session.delete(get_webhook(session, user, hook_id))


def list_deliveries(session: Session, hook: Webhook, page: Page, status: str | None = None):
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook.id)
    if status:
        stmt = stmt.where(WebhookDelivery.status == status)
    if page.after:
        try:
            stmt = stmt.where(WebhookDelivery.id < int(page.after))
        except ValueError:
            raise Invalid("after must be a delivery id (an integer)", param="after") from None
    rows = list(session.scalars(stmt.order_by(WebhookDelivery.id.desc()).limit(page.limit + 1)))
    more = len(rows) > page.limit
    rows = rows[: page.limit]
    return rows, more, (str(rows[-1].id) if more and rows else None)


# ---- the outbox ---------------------------------------------------------------------------

def enqueue(session: Session, owner_id: str, event: str, data: dict) -> str | None:
    """One delivery per subscribed webhook of `owner_id`, sharing one event id; returns it.
    `data` is written by the API's encoder (`+00:00` timestamps, as every read)."""
    hooks = [h for h in session.scalars(select(Webhook).where(Webhook.owner_id == owner_id))
             if event in (h.events or [])]
    if not hooks:
        return None
    now = utcnow()
    event_id = new_id("evt")
    body = api_json({"id": event_id, "type": event, "created_at": now, "data": data}).decode()
    session.add_all([WebhookDelivery(webhook_id=h.id, event_id=event_id, event=event, body=body,
                                     next_at=now, created_at=now) for h in hooks])
    return event_id


def _owner(session: Session, owner_id: str) -> Principal | None:
    u = session.get(User, owner_id)
    return None if u is None else Principal(u.id, u.name, u.role)


def _job_data(session: Session, job: Job) -> dict:
    """The job as its owner reads it with GET /v1/jobs/{id}: its read model, a member's
    server folders shown as labels (app/core/paths.shown)."""
    read = job_models(session, [job])[0]
    return {"job": body_of(read, _owner(session, job.owner_id))}


def on_job_status(session: Session, job: Job, old: str | None, new: str) -> None:
    """Subscriber of job status changes (called by app.jobs.service.transition)."""
    if new in TERMINAL:
        enqueue(session, job.owner_id, f"job.{new}", _job_data(session, job))
    elif old == S.running and new == S.queued and job.preemption and \
            job.preemption.get("attempt") == job.attempt - 1:
        enqueue(session, job.owner_id, "job.preempted", _job_data(session, job))


def on_run_status(session: Session, run: Run, old: str | None, new: str) -> None:
    """Subscriber of run status changes (called by app.runs.service.refresh_run)."""
    if new != old and new in TERMINAL:
        run_data = {"id": run.id, "name": run.name, "owner": run.owner_id, "status": run.status,
                    "report": run.report, "finished_at": run.finished_at}
        owner = _owner(session, run.owner_id)
        enqueue(session, run.owner_id, f"run.{new}",
                {"run": run_data if owner is None else shown(run_data, owner)})
