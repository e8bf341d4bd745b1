"""Cursor pagination: `limit` (default 20, max 100) and `after` (an id); newest first."""

from __future__ import annotations

from typing import Any

from fastapi import Query
from pydantic import BaseModel
from sqlalchemy import Select
from sqlalchemy.orm import Session


class Page(BaseModel):
    limit: int = 20
    after: str | None = None


def page_params(limit: int = Query(20, ge=1, le=100), after: str | None = Query(None)) -> Page:
    return Page(limit=limit, after=after)


def paginate(session: Session, stmt: Select, id_col: Any, page: Page) -> tuple[list, bool, str | None]:
    if page.after:
        stmt = stmt.where(id_col < page.after)
    rows = list(session.scalars(stmt.order_by(id_col.desc()).limit(page.limit + 1)))
    has_more = len(rows) > page.limit
    rows = rows[: page.limit]
    return rows, has_more, (rows[-1].id if has_more and rows else None)


def list_body(data: list, has_more: bool, next_after: str | None) -> dict:
    return {"data": data, "has_more": has_more, "next_after": next_after}
