"""Params checked at submit so a bad spec is a 422 that names the field before anything is
queued. Each type's model is named in its definition (contracts/jobtypes.py), shared with the
stages, which validate again: each can run alone from a shell."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.core.errors import Invalid
from contracts.jobtypes import JOB_TYPES
from contracts.probe import ProbeParams
from contracts.target import looks_like_template_path, template_path_message


def validate_params(type_: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params as stored on the job: validated and coerced, but only the fields the user
    set (defaults stay the stage's, so a stage version with new defaults is not hidden by
    values frozen at submit). Probe params are stored whole."""
    model = JOB_TYPES[type_].params
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
