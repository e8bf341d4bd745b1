"""Stage `extract`: target hidden states at chosen layers, for offline drafter training.

    inputs: tokenized {"path": a `datasets.load_from_disk` folder with input_ids, seq_len
                       (loss_mask is for train), "meta"}, target {resolved target}
    params: see `params.ExtractParams`
    output: artifact `hidden_states` (kind hidden_states) = out_dir/hidden_states/ holding
            hs_{idx}.safetensors per tokenized row (the layout `speculators train` reads with
            `--hidden-states-path`) and meta.json

Layer ids: `layers.py`. Storage planner (also for `POST /v1/plans`): `planner.py`.
"""

from workers.stages.extract.layers import default_layer_ids, resolve_layers
from workers.stages.extract.planner import (
    check_disk,
    disk_check,
    estimate_hidden_state_bytes,
)
from workers.stages.extract.stage import run

__all__ = ["check_disk", "default_layer_ids", "disk_check", "estimate_hidden_state_bytes",
           "resolve_layers", "run"]
