from __future__ import annotations

from fastapi import APIRouter

from app.cluster import service
from app.cluster.schemas import NodeDrain, NodeList, QueueRead
from app.core.deps import CurrentUser, SessionDep
from app.core.reads import typed

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/queue", response_model=QueueRead)
def queue(user: CurrentUser, session: SessionDep):
    return typed(service.queue_view(session))


@router.get("/nodes", response_model=NodeList)
def nodes(user: CurrentUser, session: SessionDep):
    return typed(NodeList(data=service.nodes_view(session)))


@router.post("/nodes/{name}/drain", response_model=NodeDrain)
def drain(name: str, user: CurrentUser, session: SessionDep):
    n = service.set_drain(session, user, name, True)
    return typed(NodeDrain(name=n.name, draining=n.draining))


@router.post("/nodes/{name}/undrain", response_model=NodeDrain)
def undrain(name: str, user: CurrentUser, session: SessionDep):
    n = service.set_drain(session, user, name, False)
    return typed(NodeDrain(name=n.name, draining=n.draining))
