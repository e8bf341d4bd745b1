"""A run body's target and dataset given by name (issue 27), as ids, in a short read-only
transaction of its own (the plan that follows takes seconds and holds none)."""

from __future__ import annotations

from app.core.auth import Principal
from app.core.db import unit_of_work
from app.core.names import resolve_name
from app.models import Dataset, Target
from contracts.run import RunSpec


def with_ids(body: RunSpec, user: Principal) -> RunSpec:
    if body.target_id.startswith("tgt_") and body.dataset_id.startswith("ds_"):
        return body
    with unit_of_work(read_only=True) as session:
        ids = {"target_id": resolve_name(session, Target, user, body.target_id, "target_id"),
               "dataset_id": resolve_name(session, Dataset, user, body.dataset_id,
                                          "dataset_id")}
    return body.model_copy(update=ids)
