"""A run (POST /v1/runs) and its one expansion into stage jobs.

`RunSpec.expand()` is the only place that turns a run into the jobs it submits, with every
param explicit: the API creates exactly these jobs, checks exactly these params (422 naming
`stages.<stage>.<field>`), and the plan stage dry-runs exactly these (issue #14: the chain was
built twice, once here in app/ and once in the plan stage, and the two disagreed on layer ids
and on offline runs without an extract stage).

What is pinned once, here:
- the chat-template kwargs (thinking mode): the run's, overlaid by a stage's own, given to
  generate, prepare and evaluate (docs/FIELD-NOTES.md: a thinking-mode mismatch collapses acceptance);
- the target layer ids: `stages.extract.layer_ids` or `drafter.target_layer_ids` (two
  spellings of one choice; they must agree), given to extract and to train's drafter;
- the drafter type and draft vocabulary, given to extract and prepare.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.bounds import JsonObject, check_json
from contracts.drafters import DrafterType
from contracts.jobtypes import JOB_TYPES

STAGE_ORDER = ("split", "generate", "prepare", "extract", "train", "evaluate")


class RunSpecError(ValueError):
    """The run's stages contradict each other; `param` names the field as the run spells it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param
        self.message = message


class DrafterSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: DrafterType
    num_layers: int | None = Field(None, ge=1, le=64)
    block_size: int | None = Field(None, ge=2, le=64)
    draft_vocab_size: int | None = Field(None, ge=16)
    target_layer_ids: list[int] | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _bounded_extras(self) -> "DrafterSpec":
        check_json(self.model_extra or {})  # the free-form rest of the drafter's config
        return self


class Stages(BaseModel):
    """Each stage's params (the stage's own contract, checked after expansion). `generate`
    and `evaluate` null: skipped. `extract` null: only with mode online. `split`: how much
    is held out for evaluation (contracts/split.py) when the run holds records out."""

    model_config = ConfigDict(extra="forbid")
    split: JsonObject | None = None
    # Free-form here, bounded in depth and size (contracts/bounds.py).
    generate: JsonObject | None = None
    prepare: JsonObject = Field(default_factory=dict)
    extract: JsonObject | None = Field(default_factory=lambda: {})
    train: JsonObject = Field(default_factory=dict)
    evaluate: JsonObject | None = Field(default_factory=lambda: {})


class StageJob(BaseModel):
    """One job of a run: `inputs` name earlier stages of the same run as `"@<stage>"`, or
    one named output of a stage as `"@<stage>.<output>"`."""

    stage: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    gpus: int = 0


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    target_id: str
    dataset_id: str
    drafter: DrafterSpec
    stages: Stages = Field(default_factory=Stages)
    mode: Literal["offline", "online"] = "offline"
    chat_template_kwargs: JsonObject | None = None
    priority: int = Field(50, ge=0, le=100)
    force: bool = False
    # Retention (app/storage/): true keeps the run's intermediates (offline hidden states, each
    # job's scratch); null: the server's default (DRAFTYARD_KEEP_HIDDEN_STATES).
    keep: bool | None = None
    # Start even when the plan finds errors (the records that fail are rejected and counted).
    force_plan: bool = False
    plan_sample: int = Field(200, ge=1, le=100_000)
    # What evaluate measures on when stages.evaluate.data is not given: "held_out"
    # splits a seeded share off the dataset before any stage reads it (stages.split tunes
    # it); "in_sample" measures on the records the drafter trained on, which the report and
    # the verdict then say.
    evaluation: Literal["held_out", "in_sample"] = "held_out"
    seed: int = Field(0, ge=0, description="which records are held out (the split's seed)")

    def holds_out(self) -> bool:
        """Does this run split off held-out records for its evaluation?"""
        ev = self.stages.evaluate
        return ev is not None and not ev.get("data") and self.evaluation == "held_out"

    def template_kwargs(self, stage: dict[str, Any] | None) -> dict[str, Any]:
        """The run's chat-template kwargs overlaid by a stage's own."""
        return {**(self.chat_template_kwargs or {}),
                **((stage or {}).get("chat_template_kwargs") or {})}

    def layer_ids(self) -> list[int] | None:
        """The target's aux layer ids the drafter is trained on; None: the drafter type's
        defaults (resolved against the target's config by the stages). Three spellings of one
        choice, which must agree: extract's `layer_ids`, the run's and train's drafter's
        `target_layer_ids`."""
        given = {where: ids for where, ids in (
            ("stages.extract.layer_ids", (self.stages.extract or {}).get("layer_ids")),
            ("drafter.target_layer_ids", self.drafter.target_layer_ids),
            ("stages.train.drafter.target_layer_ids",
             (self.stages.train.get("drafter") or {}).get("target_layer_ids")))
            if ids is not None}
        if len({repr(v) for v in given.values()}) > 1:
            where = list(given)
            raise RunSpecError(where[0], " and ".join(f"{k} {v}" for k, v in given.items()) +
                               " disagree; give the layer ids once")
        return next(iter(given.values()), None)

    def expand(self) -> list[StageJob]:
        """The jobs of this run, in order, with explicit params."""
        st = self.stages
        if self.mode == "offline" and st.extract is None:
            raise RunSpecError("stages.extract", "an offline run needs the extract stage "
                               "(stored hidden states); set mode to online to skip it")
        layers = self.layer_ids()
        if self.evaluation == "in_sample" and (st.evaluate or {}).get("data"):
            raise RunSpecError("evaluation", "evaluation \"in_sample\" and "
                               "stages.evaluate.data both given; choose one")
        jobs: list[StageJob] = []

        def add(stage: str, inputs: dict[str, Any], params: dict[str, Any]) -> None:
            gpus = int(params.pop("gpus", 0) or 0)
            jobs.append(StageJob(stage=stage, inputs=inputs, params=params, gpus=gpus))

        data_ref: str = self.dataset_id
        if self.holds_out():  # before any stage reads the records (contracts/split.py)
            add("split", {"dataset": data_ref}, {"seed": self.seed, **(st.split or {})})
            data_ref = "@split.train"
        if st.generate is not None:
            add("generate", {"dataset": data_ref, "target": self.target_id},
                {**st.generate, "chat_template_kwargs": self.template_kwargs(st.generate)})
            data_ref = "@generate"
        p = {**st.prepare, "chat_template_kwargs": self.template_kwargs(st.prepare)}
        if self.drafter.draft_vocab_size and "draft_vocab_size" not in p:
            p["draft_vocab_size"] = self.drafter.draft_vocab_size
        add("prepare", {"dataset": data_ref, "target": self.target_id}, p)
        train_in: dict[str, Any] = {"tokenized": "@prepare", "target": self.target_id}
        if self.mode == "offline":
            p = {**(st.extract or {}), "drafter_type": (st.extract or {}).get(
                "drafter_type", self.drafter.type)}
            if layers is not None:
                p["layer_ids"] = layers
            add("extract", {"tokenized": "@prepare", "target": self.target_id}, p)
            train_in["hidden_states"] = "@extract"
        drafter = {**self.drafter.model_dump(exclude_none=True),
                   **(st.train.get("drafter") or {})}
        if layers is not None:
            drafter["target_layer_ids"] = layers
        add("train", train_in, {**st.train, "mode": self.mode, "drafter": drafter})
        if st.evaluate is not None:
            p = {**st.evaluate, "chat_template_kwargs": self.template_kwargs(st.evaluate)}
            given = p.pop("data", None)
            # data of the run's own stages ("@generate") is what it trained on: in-sample
            own = isinstance(given, str) and given.startswith("@")
            p["evaluated_on"] = ("in_sample" if own or (not given and not self.holds_out())
                                 else "given" if given else "held_out")
            add("evaluate", {"target": self.target_id, "drafter": "@train",
                             "data": given or ("@split.held_out" if self.holds_out()
                                               else "@prepare")}, p)
        return jobs


# ---- reference fields ----------------------------------------------------------------------
# A run body names targets, datasets and artifacts in more than `target_id` and `dataset_id`
# (stages.evaluate.data). Each such field takes a name or an id, resolved by one function for
# plan and submit (app/runs/names.py); which fields they are is read from the models and the
# expansion above, so a reference a later stage adds is resolved without a list to update.

def field_value(obj: Any, path: str) -> Any:
    """The value at `a.b.c` in a run body (models and dicts alike); None when absent."""
    for part in path.split("."):
        obj = getattr(obj, part, None) if isinstance(obj, BaseModel) else \
            (obj.get(part) if isinstance(obj, dict) else None)
    return obj


def with_field(obj: Any, path: str, value: Any) -> Any:
    """A copy of `obj` with `value` at `a.b.c` (models copied, dicts rebuilt)."""
    head, _, rest = path.partition(".")
    cur = field_value(obj, head)
    new = with_field(cur or {}, rest, value) if rest else value
    if isinstance(obj, BaseModel):
        return obj.model_copy(update={head: new})
    return {**obj, head: new}


def _candidates() -> list[str]:
    """Where a reference could be: every string field of the run's models, and every input
    name of each stage's job type in that stage's params (an input given by the run)."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            if f.annotation is str:
                out.append(prefix + name)
            elif isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                walk(f.annotation, f"{prefix}{name}.")
    walk(RunSpec, "")
    for stage in Stages.model_fields:
        out += [f"stages.{stage}.{n}" for n in JOB_TYPES[stage].inputs.model_fields]
    return out


@functools.cache
def reference_fields() -> dict[str, tuple[str, ...]]:
    """Every field of a run body whose value becomes a job's input: `dotted.path` -> the kinds
    it accepts (contracts/jobtypes.py), found by expanding a body with a marker in each
    candidate field in turn and seeing which job inputs receive it."""
    base = RunSpec(name="probe", target_id="tgt_probe", dataset_id="ds_probe",
                   drafter=DrafterSpec(type="dflash"),
                   stages=Stages(split={}, generate={}, extract={}, evaluate={}))
    marker = "\x00reference"
    found: dict[str, tuple[str, ...]] = {}
    for path in _candidates():
        try:
            jobs = with_field(base, path, marker).expand()
        except RunSpecError:
            continue
        kinds = {k for j in jobs for name, v in j.inputs.items() if v == marker
                 for k in JOB_TYPES[j.stage].accepts[name]}
        if kinds:
            found[path] = tuple(sorted(kinds))
    return found
