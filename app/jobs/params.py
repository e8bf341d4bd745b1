"""Typed params per job type, checked at submit so a bad spec is a 422 that names the field
before anything is queued. The stage types' models live in `contracts/` (shared with the
stages, which validate again: each can run alone from a shell)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.errors import Invalid
from contracts import STAGE_PARAMS
from contracts.target import looks_like_template_path, template_path_message


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProbeParams(_Params):
    # An hour is plenty to test a queue or a cancel; a day-long sleep only holds a slot.
    sleep_s: float = Field(0.0, ge=0, le=3600)
    fail: bool = False
    steps: int = Field(10, ge=1, le=100000)
    # false: skip importing torch (no device list; the stage starts in ~0.2 s, not ~3 s)
    import_torch: bool = True


PARAMS: dict[str, type[BaseModel]] = {"probe": ProbeParams, **STAGE_PARAMS}


def validate_params(type_: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params as stored on the job: validated and coerced, but only the fields the user
    set (defaults stay the stage's, so a stage version with new defaults is not hidden by
    values frozen at submit). Probe params are stored whole."""
    model = PARAMS[type_]
    tmpl = params.get("chat_template") if isinstance(params, dict) else None
    if isinstance(tmpl, str) and looks_like_template_path(tmpl):
        raise Invalid(template_path_message(tmpl, "params.chat_template"),
                      param="params.chat_template", code="template_is_a_path")
    try:
        return model.model_validate(params).model_dump(mode="json",
                                                       exclude_unset=model is not ProbeParams)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = (f"unknown field 'params.{loc}' for a {type_} job"
               if err.get("type") == "extra_forbidden" else f"params.{loc}: {err.get('msg')}")
        raise Invalid(msg, param=f"params.{loc}",
                      details=[{"param": "params." + ".".join(str(p) for p in x.get("loc", ())),
                                "message": x.get("msg")} for x in e.errors()]) from e
