"""A run (POST /v1/runs) and its one expansion into stage jobs.

`RunSpec.expand()` is the only place that turns a run into the jobs it submits, with every
param explicit: the API creates exactly these jobs, checks exactly these params (422 naming
`stages.<stage>.<field>`), and the plan stage dry-runs exactly these (the chain was once
built twice, once here in app/ and once in the plan stage, and the two disagreed on layer ids
and on offline runs without an extract stage).

What is pinned once, here:
- the chat-template kwargs (thinking mode): the run's, overlaid by a stage's own, given to
  generate, prepare and evaluate (docs/FIELD-NOTES.md: a thinking-mode mismatch collapses acceptance);
- the target layer ids: `stages.extract.layer_ids` or `drafter.target_layer_ids` (two
  spellings of one choice; they must agree), given to extract and to train's drafter;
- the drafter type and draft vocabulary, given to extract and prepare.

A run names one drafter (`drafter`) or several to compare (`drafters`, each with a `name`):
they share split, generate and prepare, and one extract per distinct set of stored layers;
each gets its own train and evaluate on the same evaluation data, which the run's report
ranks (docs/compare-drafters.md). A job's key in the run is its stage (`train`), or for a
job of one of several drafters `<stage>:<name>` (`train:b8`); inputs name keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.bounds import JsonObject, check_json
from contracts.drafters import DrafterType, drafter
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


class NamedDrafter(DrafterSpec):
    """One of a run's `drafters`: a drafter, its label in the run and its own train params."""

    name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$",
        description="its label in the run (job keys, the report); default: its type")
    train: JsonObject | None = Field(
        None, description="train params of this drafter only, over stages.train")

    def config(self) -> dict[str, Any]:
        """The drafter's own fields (what train's `drafter` gets), without label and train."""
        return self.model_dump(exclude_none=True, exclude={"name", "train"})


# How many drafters one run compares: each costs a train and an evaluate.
MAX_DRAFTERS = 8


class RunDrafter(BaseModel):
    """One drafter of a run as the expansion uses it: `name` None for a run's one `drafter`,
    `param` where the body spells it (`drafter`, `drafters.2`)."""

    name: str | None
    param: str
    spec: DrafterSpec
    train: dict[str, Any] = Field(default_factory=dict)

    def key(self, stage: str) -> str:
        return stage if self.name is None else f"{stage}:{self.name}"


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
    """One job of a run: `inputs` name earlier jobs of the same run by key as `"@<key>"`, or
    one named output of a job as `"@<key>.<output>"`. `key` is unique in the run: the stage,
    or `<stage>:<drafter name>` for the jobs of one of several drafters; `drafter`: that name
    (None for shared jobs and a one-drafter run's)."""

    stage: str
    key: str = ""
    drafter: str | None = None
    inputs: dict[str, Any]
    params: dict[str, Any]
    gpus: int = 0

    @model_validator(mode="after")
    def _default_key(self) -> "StageJob":
        self.key = self.key or self.stage
        return self


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    target_id: str
    dataset_id: str
    # One drafter, or several to compare on one prepared dataset (exactly one of the two).
    drafter: DrafterSpec | None = None
    drafters: list[NamedDrafter] | None = Field(None, min_length=1, max_length=MAX_DRAFTERS)
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

    def run_drafters(self) -> list[RunDrafter]:
        """The run's drafters: its one `drafter`, or each of `drafters` with a distinct name
        (its type by default) and a distinct config (the same drafter twice would train
        the same thing twice)."""
        if (self.drafter is None) == (self.drafters is None):
            raise RunSpecError("drafters" if self.drafter else "drafter",
                               "give either drafter (one) or drafters (several to compare), "
                               "not both" if self.drafter else "drafter is required (or "
                               "drafters, a list, to compare several)")
        if self.drafter is not None:
            return [RunDrafter(name=None, param="drafter", spec=self.drafter)]
        out: list[RunDrafter] = []
        for i, d in enumerate(self.drafters or []):
            name, param = d.name or d.type, f"drafters.{i}"
            for own in ("drafter", "mode"):
                if own in (d.train or {}):
                    raise RunSpecError(f"{param}.train.{own}", f"{param}.train.{own}: a "
                                       "drafter's train params cannot set it (" + (
                                           f"give its fields in {param} itself)" if own ==
                                           "drafter" else "the run's mode is every drafter's)"))
            for j, other in enumerate(out):
                if other.name == name:
                    raise RunSpecError(f"{param}.name", f"{other.param} and {param} are both "
                                       f"named {name!r}; give each drafter a distinct name")
                if other.spec.model_dump(exclude_none=True) == d.config() and \
                        other.train == (d.train or {}):
                    raise RunSpecError(param, f"{param} is the same drafter as drafters.{j} "
                                       "(same type, options and train params)")
            out.append(RunDrafter(name=name, param=param,
                                  spec=DrafterSpec.model_validate(d.config()),
                                  train=d.train or {}))
        return out

    def layer_ids(self, d: RunDrafter | None = None) -> list[int] | None:
        """The target's aux layer ids drafter `d` (default: the run's first) is trained on;
        None: the drafter type's defaults (resolved against the target's config by the
        stages). Three spellings of one choice, which must agree: extract's `layer_ids`, the
        drafter's and train's drafter's `target_layer_ids`."""
        d = d or self.run_drafters()[0]
        given = {where: ids for where, ids in (
            ("stages.extract.layer_ids", (self.stages.extract or {}).get("layer_ids")),
            (f"{d.param}.target_layer_ids", d.spec.target_layer_ids),
            ("stages.train.drafter.target_layer_ids",
             (self.stages.train.get("drafter") or {}).get("target_layer_ids")))
            if ids is not None}
        if len({repr(v) for v in given.values()}) > 1:
            where = list(given)
            raise RunSpecError(where[0], " and ".join(f"{k} {v}" for k, v in given.items()) +
                               " disagree; give the layer ids once")
        return next(iter(given.values()), None)

    def field_of(self, key: str, where: str = "") -> str:
        """The body's field that the param `where` (`.drafter.block_size`, `.lr`) of job
        `key` came from: `stages.<stage><where>`, or for one of several drafters its own
        entry where that entry gave the field (`drafters.<i>.block_size`)."""
        stage, _, name = key.partition(":")
        for i, d in enumerate(self.drafters or []):
            if name and (d.name or d.type) == name:
                head, _, rest = where.lstrip(".").partition(".")
                field = rest.split(".")[0]
                if head == "drafter" and (field in d.config() or field not in (
                        self.stages.train.get("drafter") or {})):
                    # its own field, or the drafter as a whole (a rule across its fields)
                    return f"drafters.{i}" + (f".{rest}" if field in d.config() else "")
                if head and head in (d.train or {}):
                    return f"drafters.{i}.train{where}"
        return f"stages.{stage}{where}"

    def expand(self) -> list[StageJob]:
        """The jobs of this run, in order, with explicit params."""
        st = self.stages
        drafters = self.run_drafters()
        if self.mode == "offline" and st.extract is None:
            raise RunSpecError("stages.extract", "an offline run needs the extract stage "
                               "(stored hidden states); set mode to online to skip it")
        layers = {d.param: self.layer_ids(d) for d in drafters}
        if self.evaluation == "in_sample" and (st.evaluate or {}).get("data"):
            raise RunSpecError("evaluation", "evaluation \"in_sample\" and "
                               "stages.evaluate.data both given; choose one")
        jobs: list[StageJob] = []

        def add(stage: str, inputs: dict[str, Any], params: dict[str, Any],
                d: RunDrafter | None = None, key: str | None = None) -> None:
            gpus = int(params.pop("gpus", 0) or 0)
            jobs.append(StageJob(stage=stage, key=key or (d.key(stage) if d else stage),
                                 drafter=d.name if d else None, inputs=inputs,
                                 params=params, gpus=gpus))

        data_ref: str = self.dataset_id
        if self.holds_out():  # before any stage reads the records (contracts/split.py)
            add("split", {"dataset": data_ref}, {"seed": self.seed, **(st.split or {})})
            data_ref = "@split.train"
        if st.generate is not None:
            add("generate", {"dataset": data_ref, "target": self.target_id},
                {**st.generate, "chat_template_kwargs": self.template_kwargs(st.generate)})
            data_ref = "@generate"
        p = {**st.prepare, "chat_template_kwargs": self.template_kwargs(st.prepare)}
        # The draft vocabulary prepare stores ready-made; train builds any other size from
        # the token counts prepare stores anyway (workers/stages/train/job.py).
        vocab = {d.spec.draft_vocab_size for d in drafters if d.spec.draft_vocab_size}
        if len(vocab) == 1 and "draft_vocab_size" not in p:
            p["draft_vocab_size"] = vocab.pop()
        add("prepare", {"dataset": data_ref, "target": self.target_id}, p)
        extract_of = self._extracts(drafters, layers, add) if self.mode == "offline" else {}
        for d in drafters:
            train_in: dict[str, Any] = {"tokenized": "@prepare", "target": self.target_id}
            if d.param in extract_of:
                train_in["hidden_states"] = "@" + extract_of[d.param]
            shared = st.train.get("drafter") or {}
            # One drafter: stages.train.drafter overrides it (as always); several: it is
            # what they share, and each drafter's own fields win.
            cfg = ({**d.spec.model_dump(exclude_none=True), **shared} if d.name is None
                   else {**shared, **d.spec.model_dump(exclude_none=True)})
            if layers[d.param] is not None:
                cfg["target_layer_ids"] = layers[d.param]
            add("train", train_in, {**st.train, **d.train, "mode": self.mode, "drafter": cfg},
                d)
        if st.evaluate is not None:
            for d in drafters:
                self._evaluate(d, add)
        return jobs

    def _extracts(self, drafters: list[RunDrafter], layers: dict[str, list[int] | None],
                  add: Callable[..., None]) -> dict[str, str]:
        """One extract per distinct set of stored layers: explicit ids, or a type's default
        rule (drafter types with one rule share it). Answers each drafter's extract key."""
        st = self.stages
        groups: dict[Any, list[RunDrafter]] = {}
        for d in drafters:
            kind = drafter(d.spec.type)
            ids = layers[d.param]
            groups.setdefault((kind.extract, tuple(ids) if ids is not None else kind.layers),
                              []).append(d)
        out: dict[str, str] = {}
        for members in groups.values():
            first = members[0]
            key = "extract" if len(groups) == 1 else first.key("extract")
            p = {**(st.extract or {}), "drafter_type": (st.extract or {}).get(
                "drafter_type", first.spec.type)}
            if layers[first.param] is not None:
                p["layer_ids"] = layers[first.param]
            add("extract", {"tokenized": "@prepare", "target": self.target_id}, p, key=key)
            out.update({d.param: key for d in members})
        return out

    def _evaluate(self, d: RunDrafter, add: Callable[..., None]) -> None:
        """Drafter `d`'s evaluate: every drafter of a run on the same data and params."""
        p = {**(self.stages.evaluate or {}),
             "chat_template_kwargs": self.template_kwargs(self.stages.evaluate)}
        given = p.pop("data", None)
        # data of the run's own stages ("@generate") is what it trained on: in-sample
        own = isinstance(given, str) and given.startswith("@")
        p["evaluated_on"] = ("in_sample" if own or (not given and not self.holds_out())
                             else "given" if given else "held_out")
        add("evaluate", {"target": self.target_id, "drafter": "@" + d.key("train"),
                         "data": given or ("@split.held_out" if self.holds_out()
                                           else "@prepare")}, p, d)


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
