"""Names where users think in names: a target's or a dataset's name is unique per
owner (a unique index, migration f27_unique_names), so a run body, a plan and the CLI may
give a name where an id goes."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.auth import Principal
from app.core.errors import Conflict, Invalid

# model class -> (what it is called, its id prefix)
_WHAT = {"Target": ("target", "tgt_"), "Dataset": ("dataset", "ds_")}


def check_name_free(session: Session, model, user: Principal, name: str) -> None:
    """409 naming the existing one when the caller already has one of that name."""
    what, _ = _WHAT[model.__name__]
    taken = session.scalar(select(model.id).where(model.owner_id == user.id,
                                                  model.name == name))
    if taken is not None:
        raise Conflict(f"you already have a {what} named {name!r}: {taken} (names are unique "
                       f"per owner; choose another name, or use {taken})", code="name_taken",
                       param="name", details={"id": taken})


def resolve_name(session: Session, model, user: Principal, ref: str, param: str) -> str:
    """The id `ref` names: an id as it is; else the caller's own of that name, else the one
    of that name among everyone's (422 when there is none, or several)."""
    what, prefix = _WHAT[model.__name__]
    if ref.startswith(prefix):
        return ref
    own = session.scalar(select(model.id).where(model.owner_id == user.id, model.name == ref))
    if own is not None:
        return own
    others: list[str] = list(session.scalars(select(model.id).where(model.name == ref).limit(6)))
    if len(others) == 1:
        return others[0]
    if others:
        raise Invalid(f"{param}: {len(others)} {what}s of other users are named {ref!r} "
                      f"({', '.join(others[:5])}); give the id", param=param,
                      code="ambiguous_name")
    raise Invalid(f"{param}: no {what} has the id or name {ref!r}", param=param,
                  code="unknown_input")
