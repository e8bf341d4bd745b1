"""Typed, validated params of the `train` stage.

Defaults follow speculators 0.9's own recipe where it has one (`speculators train`'s
`TrainConfig`), and FIELD-NOTES.md where CPU needs something else. The stage validates
them with `workers.stages.kernel.parse_params` before anything heavy is loaded.
"""

from __future__ import annotations

from contracts.train import (  # noqa: F401  the models live in contracts/ (the API validates with them too)
    STEERING_FIELDS,
    DrafterParams,
    OnlineParams,
    TrainParams,
)
