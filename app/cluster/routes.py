from __future__ import annotations

from app.core.jsonresp import SafeJSONResponse
from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from app.cluster import service
from app.core.auth import Principal, current_user
from app.core.db import request_session

router = APIRouter(prefix="/v1", tags=["cluster"])
DB = Depends(request_session, scope="function")


@router.get("/queue")
def queue(user: Principal = Depends(current_user), session: Session = DB):
    return SafeJSONResponse(service.queue_view(session))


@router.get("/nodes")
def nodes(user: Principal = Depends(current_user), session: Session = DB):
    return SafeJSONResponse({"data": service.nodes_view(session)})


@router.post("/nodes/{name}/drain")
def drain(name: str, user: Principal = Depends(current_user), session: Session = DB):
    n = service.set_drain(session, user, name, True)
    return {"name": n.name, "draining": n.draining}


@router.post("/nodes/{name}/undrain")
def undrain(name: str, user: Principal = Depends(current_user), session: Session = DB):
    n = service.set_drain(session, user, name, False)
    return {"name": n.name, "draining": n.draining}
