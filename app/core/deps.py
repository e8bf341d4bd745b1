"""The dependencies every route declares, as `Annotated` types, in one place: a route says
`session: SessionDep, user: CurrentUser` instead of repeating `Depends(...)`.

`SessionDep` is scoped to the route function (`scope="function"`): the transaction commits
when the handler returns, before the response is sent, so a client that reads its answer
and then reads again sees what it wrote."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session

from app.core.auth import Principal, current_user, require_admin
from app.core.db import request_session
from app.core.pagination import Page, page_params

SessionDep = Annotated[Session, Depends(request_session, scope="function")]
CurrentUser = Annotated[Principal, Depends(current_user)]
AdminUser = Annotated[Principal, Depends(require_admin)]
PageDep = Annotated[Page, Depends(page_params)]
