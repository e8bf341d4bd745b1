"""Typed, validated params of the `train` stage.

Defaults follow speculators 0.9's own recipe where it has one (`speculators train`'s
`TrainConfig`), and FIELD-NOTES.md where CPU needs something else. A bad field raises
`StageError("invalid_params")` naming the field, before anything heavy is loaded.
"""

from __future__ import annotations

from pydantic import ValidationError

from contracts.train import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    STEERING_FIELDS,
    DrafterParams,
    OnlineParams,
    TrainParams,
)
from workers.stages.common import StageError


def parse_params(raw: dict | None) -> TrainParams:
    """Validate `spec["params"]`; raise StageError("invalid_params") naming the fields."""
    try:
        return TrainParams.model_validate(raw or {})
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err.get("loc", ())) or "params"
            problems.append(f"{loc}: {err.get('msg')}")
        raise StageError("invalid_params", "invalid train params: " + "; ".join(problems),
                         details=[{"field": ".".join(str(p) for p in x.get("loc", ())),
                                   "message": x.get("msg")} for x in e.errors()]) from None
