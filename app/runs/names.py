"""A run body's references given by name, as ids: every field that names a target,
a dataset or an artifact (contracts/run.py `reference_fields`: `target_id`, `dataset_id`,
`stages.evaluate.data`), resolved and checked here, the one resolver that plan and submit
both call, so a body the plan passes is one submit takes. In a short read-only transaction of
its own (the plan that follows takes seconds and holds none)."""

from __future__ import annotations

from app.core.auth import Principal
from app.core.db import unit_of_work
from app.core.ids import PREFIXES
from app.core.names import resolve_name
from app.jobs.service import check_reference
from app.models import Dataset, Target
from contracts.run import RunSpec, field_value, reference_fields, with_field

# The kinds of thing a name can stand for (artifacts have ids only), in the order a name is
# looked up when a field accepts several (stages.evaluate.data: a dataset or tokenized rows).
NAMED = (("dataset", Dataset), ("target", Target))


def _is_id(ref: str) -> bool:
    return ref.partition("_")[0] in PREFIXES and "_" in ref


def with_ids(body: RunSpec, user: Principal) -> RunSpec:
    """`body` with every reference field an id, each checked as submit checks a job's input
    (422 naming the field as the body spells it). `@stage` references (the run's own
    stages) are left as they are."""
    refs = {path: (v, kinds) for path, kinds in reference_fields().items()
            if isinstance(v := field_value(body, path), str) and not v.startswith("@")}
    if not refs:
        return body
    with unit_of_work(read_only=True) as session:
        for path, (ref, kinds) in refs.items():
            model = next((m for kind, m in NAMED if kind in kinds), None)
            if not _is_id(ref) and model is not None:
                ref = resolve_name(session, model, user, ref, path)
                body = with_field(body, path, ref)
            check_reference(session, ref, path, kinds)
    return body
