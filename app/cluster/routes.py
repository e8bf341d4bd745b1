from __future__ import annotations

from fastapi import APIRouter

from app.core.jsonresp import SafeJSONResponse

from app.cluster import service
from app.core.deps import CurrentUser, SessionDep

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/queue")
def queue(user: CurrentUser, session: SessionDep):
    return SafeJSONResponse(service.queue_view(session))


@router.get("/nodes")
def nodes(user: CurrentUser, session: SessionDep):
    return SafeJSONResponse({"data": service.nodes_view(session)})


@router.post("/nodes/{name}/drain")
def drain(name: str, user: CurrentUser, session: SessionDep):
    n = service.set_drain(session, user, name, True)
    return {"name": n.name, "draining": n.draining}


@router.post("/nodes/{name}/undrain")
def undrain(name: str, user: CurrentUser, session: SessionDep):
    n = service.set_drain(session, user, name, False)
    return {"name": n.name, "draining": n.draining}
