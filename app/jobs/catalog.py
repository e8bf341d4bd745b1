"""What each job type consumes and produces, and its stage version (part of the reuse
fingerprint: bump it when a stage's output for the same inputs and params changes)."""

from __future__ import annotations

# input name -> artifact kinds it accepts (a dataset id resolves to its dataset artifact,
# a target id to the target; `{"job": id}` to that job's output of a matching kind)
INPUTS: dict[str, dict[str, tuple[str, ...]]] = {
    "probe": {},
    "ingest": {"source": ("upload", "path")},
    "mix": {"sources": ("dataset",)},
    "split": {"dataset": ("dataset",)},
    "generate": {"dataset": ("dataset",), "target": ("target",)},
    "prepare": {"dataset": ("dataset",), "target": ("target",)},
    "extract": {"tokenized": ("tokenized",), "target": ("target",)},
    "train": {"tokenized": ("tokenized",), "target": ("target",),
              "hidden_states": ("hidden_states",)},
    "evaluate": {"target": ("target",), "drafter": ("drafter",),
                 "data": ("tokenized", "dataset"), "baseline_drafter": ("drafter",)},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "probe": (),
    "ingest": ("source",),
    "mix": ("sources",),
    "split": ("dataset",),
    "generate": ("dataset", "target"),
    "prepare": ("dataset", "target"),
    "extract": ("tokenized", "target"),
    "train": ("tokenized", "target"),
    "evaluate": ("target", "drafter", "data"),
}
STAGE_VERSIONS: dict[str, int] = {
    "probe": 1, "ingest": 1, "mix": 1, "split": 1, "generate": 1, "prepare": 1, "extract": 1,
    "train": 1, "evaluate": 1,
}
# Preemption (issue 16): a type may be preempted only if a requeued attempt continues from
# what the stopped one saved in work_dir. train checkpoints on SIGTERM and is preemptible by
# default; generate and extract resume from their finished shards/samples and probe has
# nothing to lose, so they may opt in with `preemptible: true`; the others cannot.
PREEMPTIBLE_BY_DEFAULT = frozenset({"train"})
RESUMABLE = frozenset({"train", "generate", "extract", "probe"})
# Probe jobs are diagnostics: never reuse one.
NEVER_REUSE = frozenset({"probe"})
