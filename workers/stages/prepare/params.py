"""Typed params of the prepare stage. Unknown fields are refused: a typo in `train_on` or
`chat_template_kwargs` must fail the job, not silently train on the wrong tokens."""

from __future__ import annotations

from contracts.prepare import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    PrepareParams,
)
