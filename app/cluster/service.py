"""Nodes and their GPUs: registration, heartbeats, drain; the queue view."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.config import get_settings
from app.core.db import db_now, utcnow
from app.core.errors import Forbidden, NotFound
from app.cluster.schemas import NodeGpu, NodeRead, QueueRead, QueueUser
from app.jobs.lifecycle import queue_changed
from app.jobs.render import job_models
from app.jobs.states import LEASED, WAITING
from app.models import Gpu, Job, Node, User
from app.scheduler.reads import usage_by_owner


def register_node(session: Session, name: str, gpus: list[dict], *, hostname: str,
                  cpu_slots: int, info: dict) -> None:
    node = session.get(Node, name)
    if node is None:
        node = Node(name=name)
        session.add(node)
    node.hostname, node.cpu_slots, node.info = hostname, cpu_slots, info
    node.alive, node.last_heartbeat = True, db_now(session, force=True)
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


def mark_offline(session: Session, name: str) -> None:
    """A worker stopping cleanly: no new work goes to it from now (not after stale_after_s)."""
    node = session.get(Node, name)
    if node is not None:
        node.alive = False


def heartbeat(session: Session, name: str) -> None:
    node = session.get(Node, name)
    if node is not None:
        node.last_heartbeat = db_now(session)
        node.alive = True


def first_live_node(session: Session) -> str | None:
    """The live node first by name: the one that reaps and refreshes queue reasons."""
    cutoff = db_now(session) - timedelta(seconds=get_settings().stale_after_s)
    return session.scalar(select(func.min(Node.name)).where(Node.alive.is_(True),
                                                            Node.last_heartbeat >= cutoff))


def set_drain(session: Session, user: Principal, name: str, draining: bool) -> Node:
    if not user.is_admin:
        raise Forbidden("draining a node is an admin action", code="admin_only")
    node = session.get(Node, name)
    if node is None:
        raise NotFound(f"node {name} not found", param="name")
    node.draining = draining
    if not draining:
        queue_changed(session)  # its GPUs are usable again
    return node


def nodes_view(session: Session) -> list[NodeRead]:
    """Every registered node; `alive` means heartbeating within stale_after_s, `schedulable`
    alive and not draining (what the scheduler places jobs on)."""
    cutoff = db_now(session) - timedelta(seconds=get_settings().stale_after_s)
    gpus: dict[str, list[NodeGpu]] = {}
    for g in session.scalars(select(Gpu).order_by(Gpu.node, Gpu.index)):
        gpus.setdefault(g.node, []).append(NodeGpu(index=g.index, name=g.name,
                                                   memory_bytes=g.memory_bytes, job_id=g.job_id))
    out = []
    for n in session.scalars(select(Node).order_by(Node.name)):
        mine = gpus.get(n.name, [])
        alive = n.alive and n.last_heartbeat >= cutoff  # the scheduler's own test (node_states)
        out.append(NodeRead(name=n.name, hostname=n.hostname, alive=alive,
                            draining=n.draining, schedulable=alive and not n.draining,
                            last_heartbeat=n.last_heartbeat, cpu_slots=n.cpu_slots,
                            info=n.info, gpus_total=len(mine),
                            gpus_free=sum(1 for g in mine if g.job_id is None), gpus=mine))
    return out


def queue_view(session: Session) -> QueueRead:
    active = list(session.scalars(select(Job).where(
        Job.status.in_(LEASED)).order_by(Job.started_at)))
    waiting = list(session.scalars(select(Job).where(Job.status.in_(WAITING))
                                   .order_by(Job.queue_position.is_(None), Job.queue_position,
                                             Job.created_at).limit(500)))
    names = dict(session.execute(select(User.id, User.name)).all())
    usage = usage_by_owner(session, utcnow())
    counts = {o: (int(n), int(g or 0)) for o, n, g in session.execute(
        select(Job.owner_id, func.count(), func.sum(Job.gpus_requested))
        .where(Job.status.in_(WAITING)).group_by(Job.owner_id))}
    # jobs running per owner (CPU jobs too: the table was empty while one ran)
    running: dict[str, int] = {}
    for j in active:
        running[j.owner_id] = running.get(j.owner_id, 0) + 1
    users = sorted(set(usage) | set(counts) | set(running))
    return QueueRead(
        running=job_models(session, active),
        waiting=job_models(session, waiting),
        quota_gpus=get_settings().user_gpu_quota or None,
        users=[QueueUser(id=u, name=names.get(u), running=running.get(u, 0),
                         gpus_held=usage[u].gpus_held if u in usage else 0,
                         gpu_hours_24h=round(usage[u].gpu_hours, 4) if u in usage else 0.0,
                         waiting=counts.get(u, (0, 0))[0],
                         gpus_waiting=counts.get(u, (0, 0))[1]) for u in users],
    )
