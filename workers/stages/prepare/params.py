"""Typed params of the prepare stage. Unknown fields are refused: a typo in `train_on` or
`chat_template_kwargs` must fail the job, not silently train on the wrong tokens."""

from __future__ import annotations

from pydantic import ValidationError

from contracts.prepare import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    PrepareParams,
)
from workers.stages.common import StageError


def parse_params(raw: dict | None) -> PrepareParams:
    try:
        return PrepareParams.model_validate(raw or {})
    except ValidationError as e:
        errs = e.errors()
        field = ".".join(str(x) for x in errs[0]["loc"])
        raise StageError("invalid_params", f"params.{field}: {errs[0]['msg']}",
                         details={"errors": [{"field": ".".join(str(x) for x in er["loc"]),
                                              "message": er["msg"]} for er in errs]}) from None
