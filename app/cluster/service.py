"""Nodes and their GPUs: registration, heartbeats, drain; the queue view."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.db import utcnow
from app.core.errors import Forbidden, NotFound
from app.models import Gpu, Job, Node, User


def register_node(session: Session, name: str, gpus: list[dict], *, hostname: str,
                  cpu_slots: int, info: dict) -> None:
    node = session.get(Node, name)
    if node is None:
        node = Node(name=name)
        session.add(node)
    node.hostname, node.cpu_slots, node.info = hostname, cpu_slots, info
    node.alive, node.last_heartbeat = True, utcnow()
    session.flush()
    have = {g.index: g for g in session.scalars(select(Gpu).where(Gpu.node == name))}
    want = {int(g["index"]): g for g in gpus}
    for idx, g in want.items():
        row = have.get(idx) or Gpu(node=name, index=idx)
        row.name, row.memory_bytes = g.get("name"), g.get("memory_bytes")
        session.add(row)
    gone = [i for i in have if i not in want and have[i].job_id is None]
    if gone:
        session.execute(delete(Gpu).where(Gpu.node == name, Gpu.index.in_(gone)))


def heartbeat(session: Session, name: str) -> None:
    node = session.get(Node, name)
    if node is not None:
        node.last_heartbeat = utcnow()
        node.alive = True


def set_drain(session: Session, user: Principal, name: str, draining: bool) -> Node:
    if not user.is_admin:
        raise Forbidden("draining a node is an admin action", code="admin_only")
    node = session.get(Node, name)
    if node is None:
        raise NotFound(f"node {name} not found", param="name")
    node.draining = draining
    return node


def nodes_view(session: Session) -> list[dict]:
    gpus: dict[str, list[dict]] = {}
    for g in session.scalars(select(Gpu).order_by(Gpu.node, Gpu.index)):
        gpus.setdefault(g.node, []).append({"index": g.index, "name": g.name,
                                            "memory_bytes": g.memory_bytes, "job_id": g.job_id})
    return [{"name": n.name, "hostname": n.hostname, "alive": n.alive, "draining": n.draining,
             "last_heartbeat": n.last_heartbeat, "cpu_slots": n.cpu_slots, "info": n.info,
             "gpus": gpus.get(n.name, [])}
            for n in session.scalars(select(Node).order_by(Node.name))]


def queue_view(session: Session) -> dict:
    from app.jobs.render import jobs_read
    from app.scheduler.service import usage_by_owner

    active = list(session.scalars(select(Job).where(
        Job.status.in_(("dispatched", "running", "cancelling"))).order_by(Job.started_at)))
    waiting = list(session.scalars(select(Job).where(Job.status.in_(("queued", "pending")))
                                   .order_by(Job.queue_position.is_(None), Job.queue_position,
                                             Job.created_at).limit(500)))
    names = dict(session.execute(select(User.id, User.name)))
    usage = usage_by_owner(session, utcnow())
    counts = dict(session.execute(select(Job.owner_id, func.count()).where(
        Job.status.in_(("queued", "pending"))).group_by(Job.owner_id)))
    users = sorted(set(usage) | set(counts))
    return {
        "running": jobs_read(session, active),
        "waiting": jobs_read(session, waiting),
        "users": [{"id": u, "name": names.get(u), "gpus_held": usage.get(u).gpus_held if u in usage else 0,
                   "gpu_hours_24h": round(usage[u].gpu_hours, 4) if u in usage else 0.0,
                   "waiting": counts.get(u, 0)} for u in users],
    }
