"""No code from a request: every job type's params and inputs, walked from the
registry the API validates with (not a hand list), and every free-form or path-like field in
them (strings, lists of strings, free dicts):

- no field names a program, an interpreter, a module, a raw flag or a host;
- every free-form field is reviewed below, with how it is used and why that is safe, so a new
  one (say, `extra_args` added back) fails here until someone looks at it;
- canary values put into every such field (a shell, a flag that loads a file, a module name,
  a path that climbs out of the roots) are either refused by the params model or never reach
  a subprocess's command line, a module import or a file open: the stages' real command
  builders run with them, and the generate stage runs whole (its vLLM server included,
  against the fake server), with subprocess.Popen, importlib.import_module and open
  instrumented (recording each call, then doing it).
"""

from __future__ import annotations

import builtins
import importlib
import io
import re
import subprocess
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from contracts.jobtypes import JOB_TYPES

# Every job type's params and inputs models, from the one registry the API, the scheduler and
# the stages read.
PARAMS = {name: d.params for name, d in JOB_TYPES.items()}
STAGE_INPUTS = {name: d.inputs for name, d in JOB_TYPES.items()}

CANARIES = ["/bin/sh", "--chat-template=/etc/passwd", "os", "../../etc/passwd"]

# Field names that say "a program, an interpreter, a module, a raw flag or a host".
FORBIDDEN = re.compile(r"(^|_)(executable|exe|python|interpreter|extra|args|argv|cmd|command|"
                       r"module|script|plugin|entrypoint|host|url|shell|binary)(_|$)")

# Every free-form or path-like field of a job's params or inputs, how it is used, why it is
# safe. A new one fails test_every_free_form_field_is_reviewed until it is added here.
REVIEWED = {
    "params.ingest.dataset_name": "the dataset's display name, stored on its row",
    "params.generate.stop": "stop strings, sent as data in the completion request's body",
    "params.generate.chat_template": "Jinja text, rendered by transformers' "
                                     "ImmutableSandboxedEnvironment (no file or module access)",
    "params.generate.chat_template_kwargs": "variables of that sandboxed template",
    "params.prepare.chat_template": "Jinja text, rendered in workers/stages/prepare/templates.py's "
                                    "ImmutableSandboxedEnvironment (no loader: no includes)",
    "params.prepare.chat_template_kwargs": "variables of that sandboxed template",
    "params.evaluate.chat_template": "as generate's: transformers' sandboxed template",
    "params.evaluate.chat_template_kwargs": "variables of that sandboxed template",
    # A name checked against the drafter registry (contracts/drafters.py DrafterType): a
    # str so that a registered type is taken, but any other value is refused at validation.
    "params.extract.drafter_type": "a registered drafter type",
    "params.train.drafter.type": "a registered drafter type",
    "inputs.*.path": "a file or folder: checked against the data/model roots at submit "
                     "(app/jobs/inputs.py, 403 path_not_allowed) and again by the stage "
                     "(workers/stages/common.check_roots); tests/service/test_security.py",
    "inputs.*.name": "a display name of the ingested source, stored in its meta",
    # References: ids looked up in the database (app/jobs/inputs.py), never a path or name
    # of anything outside it; the stage gets the resolved row's checked path.
    "inputs.*": "a reference: a dataset/artifact/target/job id",
    "inputs.*.artifact": "an artifact id", "inputs.*.job": "a job id",
    "inputs.*.output": "the name of one of that job's outputs",
    "inputs.*.dataset_id": "a dataset id",
}


def _free_kind(ann: Any) -> str | None:
    """'str', 'list' (of strings) or 'dict' when `ann` admits free-form text, else None."""
    origin = typing.get_origin(ann)
    if ann is str or ann is Any:
        return "str"
    if origin is typing.Literal:
        return None
    if origin is typing.Annotated:
        return _free_kind(typing.get_args(ann)[0])
    if origin in (list, tuple, set, frozenset):
        return "list" if any(_free_kind(a) for a in typing.get_args(ann)) else None
    if ann is dict or origin is dict:
        return "dict"
    if origin in (typing.Union, types.UnionType):
        kinds = [k for a in typing.get_args(ann) if (k := _free_kind(a))]
        return kinds[0] if kinds else None
    return None


def _submodels(ann: Any) -> Iterator[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        yield ann
    for a in typing.get_args(ann):
        yield from _submodels(a)


def _fields(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(dotted name, free-form kind or '', path inside the model) of every field, nested
    models included."""
    for name, f in model.model_fields.items():
        yield f"{prefix}.{name}", _free_kind(f.annotation) or "", (name,)
        for sub in _submodels(f.annotation):
            for dotted, kind, path in _fields(sub, f"{prefix}.{name}"):
                yield dotted, kind, (name, *path)


def all_fields() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(job type, dotted name, kind, path) over every params and inputs model."""
    out = []
    for type_, model in PARAMS.items():
        out += [(type_, d, k, p) for d, k, p in _fields(model, f"params.{type_}")]
    for type_, model in STAGE_INPUTS.items():
        out += [(type_, re.sub(r"^inputs\.[^.]+\.[^.]+", "inputs.*", d), k, p)
                for d, k, p in _fields(model, f"inputs.{type_}")]
    return out


def _reviewed(dotted: str) -> bool:
    return dotted in REVIEWED or re.sub(r"^inputs\.[^.]+\.[^.]+", "inputs.*", dotted) in REVIEWED


def test_the_walk_sees_every_job_type_and_its_nested_models():
    types_ = {t for t, *_ in all_fields()}
    assert types_ >= set(PARAMS) - {"probe"} and len(PARAMS) >= 8, types_
    dotted = {d for _, d, _, _ in all_fields()}
    # nested models are walked (a field two levels down, and one in a list of models)
    assert "params.generate.vllm.enforce_eager" in dotted
    assert "params.train.online.gpu_memory_utilization" in dotted


def test_no_field_names_a_program_interpreter_module_flag_or_host():
    bad = [d for _, d, _, path in all_fields() if FORBIDDEN.search(path[-1])]
    assert not bad, f"a request may not name a program, module, flag or host: {bad}"


def test_every_free_form_field_is_reviewed():
    found = {d for _, d, kind, _ in all_fields() if kind}
    new = sorted(d for d in found if not _reviewed(d))
    assert not new, f"free-form fields nobody reviewed (see REVIEWED): {new}"
    gone = sorted(r for r in REVIEWED if not any(_reviewed(d) and (d == r or r.startswith(
        "inputs.*")) for d in found))
    assert not gone, f"REVIEWED names fields that no longer exist: {gone}"


# ---- canaries through the real code ---------------------------------------------------------

def _value(kind: str, canary: str) -> Any:
    return {"str": canary, "list": [canary], "dict": {canary: canary}}[kind]


def _set(obj: dict, path: tuple[str, ...], value: Any) -> dict:
    d = obj
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value
    return obj


def accepted_canaries() -> dict[str, list[tuple[tuple[str, ...], Any]]]:
    """Per job type, the canary values its params model accepts (the rest it refuses)."""
    out: dict[str, list] = {}
    for type_, dotted, kind, path in all_fields():
        if not kind or not dotted.startswith("params."):
            continue
        for canary in CANARIES:
            try:
                PARAMS[type_].model_validate(_set({}, path, _value(kind, canary)))
            except ValidationError:
                continue  # refused: it reaches nothing
            out.setdefault(type_, []).append((path, _value(kind, canary)))
    return out


class Recorder:
    """Instruments subprocess.Popen, importlib.import_module and open: each call is recorded
    (its command line, module name or path) and then made, unchanged."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.calls: list[tuple[str, str]] = []
        rec = self.calls
        real_open, real_import = builtins.open, importlib.import_module

        class RecordingPopen(subprocess.Popen):  # type: ignore[type-arg]
            def __init__(self, args, *a, **kw):
                rec.append(("subprocess", " ".join(map(str, args))))
                super().__init__(args, *a, **kw)

        def rec_open(file, *a, **kw):
            rec.append(("open", str(file)))
            return real_open(file, *a, **kw)

        def rec_import(name, *a, **kw):
            rec.append(("import", name))
            return real_import(name, *a, **kw)

        monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
        monkeypatch.setattr(builtins, "open", rec_open)
        monkeypatch.setattr(io, "open", rec_open)
        monkeypatch.setattr(importlib, "import_module", rec_import)

    def hits(self) -> list[tuple[str, str]]:
        """Calls whose argument is a canary, or holds a path-like one."""
        return [(k, a) for k, a in self.calls
                if any(a == c or ("/" in c and c in a) for c in CANARIES)]


def _builder_commands(type_: str, params: dict, tmp: Path, target: Path) -> list[list[str]]:
    """The command lines the stage of `type_` would start with these params (its real
    builders), [] for a type that starts no process of its own."""
    from procgroup import free_port

    port = free_port()
    if type_ == "generate":
        from contracts.generate import GenerateParams
        from workers.stages.generate.backends.vllm import build_serve_command

        p = GenerateParams.model_validate(params)
        return [build_serve_command(p.vllm, "/models/t", port=port, served_name="m")]
    if type_ == "extract":
        from contracts.extract import ExtractParams
        from tests.stages.conftest import target_input
        from workers.stages.extract.backends import ExtractJob
        from workers.stages.extract.backends.vllm import server_command
        from workers.stages.extract.layers import resolve_layers

        p = ExtractParams.model_validate(params)
        t = target_input(target)
        job = ExtractJob(tokenized_path=str(tmp), target=t, dtype=p.dtype,
                         layers=resolve_layers(t["config"], "eagle3", [2, 4, 5]),
                         batch_tokens=p.batch_tokens, batch_mode="padded",
                         attn_implementation=p.attn_implementation, folder=tmp / "hs",
                         work_dir=tmp, workers=1, vllm=p.vllm)
        return [server_command(job, port, tmp / "staging", 64, 1)]
    if type_ == "train":
        from contracts.train import TrainParams
        from workers.stages.train import launch

        p = TrainParams.model_validate(params)
        return [launch.vllm_server_command("/models/t", [1], 2, tmp, port, 1, 64,
                                           p.online.gpu_memory_utilization, p.online),
                launch.torchrun_command(2, tmp / "w.json")]
    if type_ == "evaluate":
        from contracts.evaluate import EvalParams
        from workers.stages.evaluate.vllm_metrics import serve_command as eval_serve

        p = EvalParams.model_validate(params)
        return [eval_serve("/models/t", "/models/d", "dflash", 3, port, options=p.vllm)]
    return []


def _minimal(type_: str) -> dict:
    return {"train": {"drafter": {"type": "dflash"}}}.get(type_, {})


def test_canaries_are_refused_or_reach_no_command_line(tiny_target, tmp_path):
    """Each free-form field's accepted canaries, through the command builders of the stages
    that start processes (generate, extract, train, evaluate): none in any argument."""
    for type_, values in accepted_canaries().items():
        for path, value in values:
            params = _set(_minimal(type_), path, value)
            for cmd in _builder_commands(type_, params, tmp_path, tiny_target):
                leaked = [a for a in cmd for c in CANARIES if a == c or ("/" in c and c in a)]
                assert not leaked, (type_, path, value, cmd)


RECORDS = [{"id": "u1", "source": "t:1", "messages": [{"role": "user", "content": "Say hi."}]}]


def test_canaries_through_the_generate_stage_reach_no_process_import_or_file(
        tiny_target, tmp_path, monkeypatch):
    """The generate stage, whole, with every free-form field at once set to canaries (those
    its model accepts), backend vllm against the fake server: what it starts, imports and
    opens never carries a canary."""
    from tests.stages.conftest import target_input
    from tests.stages.generate_support import fake_vllm_setting, make_spec, run_stage

    params: dict = {"backend": "vllm", "max_tokens": 3,
                    "vllm": {"tensor_parallel_size": 1, "data_parallel_size": 1}}
    for path, value in accepted_canaries()["generate"]:
        if path[-1] == "chat_template":  # a template that renders, holding every canary
            value = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                     + "".join("{{ '%s' }}" % c for c in CANARIES))
        _set(params, path, value if not isinstance(value, dict) else
             {**params.get(path[-1], {}), **value})
    assert set(params) >= {"stop", "chat_template", "chat_template_kwargs"}, params
    for k, v in fake_vllm_setting().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(tmp_path / "rec.json"))
    monkeypatch.setenv("FAKE_VLLM_ANSWER", "[9707, 151645]")
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), **params)
    spec["params"]["backend"] = "vllm"
    rec = Recorder(monkeypatch)
    result = run_stage(spec)
    assert result["backend"] == "vllm" and result["num_records"] == 1, result
    assert any(k == "subprocess" for k, _ in rec.calls)  # the server was started, recorded
    assert any(k == "open" for k, _ in rec.calls)
    assert not rec.hits(), rec.hits()
