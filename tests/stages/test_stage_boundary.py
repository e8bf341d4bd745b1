"""The typed stage boundary (workers/stages/entry.py, contracts/resolved.py): the entry point
parses a stage's params and resolved inputs once, by the job type's models, and calls
`run(params, inputs, ctx)`; no stage parses its own params or reads a resolved target or
artifact by string key, and a malformed spec is refused naming the field.

The source check counts, in every module of workers/stages/ but the entry point:
- a read of a spec (`spec[...]`, `spec.get(...)`) or a parameter named `spec`, but where
  OTHER_SPECS says what else it is;
- a read by string key of a field the resolved models have (`x["path"]`, `x.get("meta")`),
  but for the dicts listed in NOT_INPUTS, which are not resolved inputs;
- a call of `parse_params` (a stage's params come parsed), but where PARSES_OTHERS says why.
On the code before the boundary it found 138 such places; there are none now.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.jobtypes import JOB_TYPES
from contracts.resolved import ResolvedArtifact, ResolvedDataset, ResolvedTarget
from workers.stages.common import StageContext, StageError
from workers.stages.entry import MODELS, STAGES, call, parse

REPO = Path(__file__).resolve().parents[2]
STAGE_DIR = REPO / "workers" / "stages"
BOUNDARY = {"entry.py", "__main__.py"}  # where a spec dict is read, by design

# The fields of the resolved models, and the spec's own two keys.
KEYS = ({*ResolvedTarget.model_fields, *ResolvedArtifact.model_fields,
         *ResolvedDataset.model_fields, "inputs", "params"} - {"id", "name", "kind"})
# (module, receiver) of dicts read by such a key that are not resolved inputs.
NOT_INPUTS = {
    ("evaluate/params.py", "src"): "a producing stage's manifest (its recorded template)",
    ("prepare/__init__.py", "gen"): "the generate stage's manifest (contracts/storage.py)",
    ("plan.py", "chain[key]"): "a run's job params, as the plan checks the run's body",
}
# (module, function) that reads a dict named `spec` that is no stage's params or inputs.
OTHER_SPECS = {
    ("common.py", "from_spec"): "the context's folders, events file and limits",
    ("train/build.py", "vllm_speculative_config"): "a checkpoint's speculators_config",
}
# (module, function) that calls parse_params on params that are not its own.
PARSES_OTHERS = {
    ("plan.py", "_params"): "the dry run validates each job of the run as its stage will",
}


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the function that holds it ('' at module level)."""
    out: dict[ast.AST, str] = {}

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            out[child] = name
            visit(child, name)

    visit(tree, "")
    return out


def boundary_violations(root: Path) -> list[str]:
    bad: list[str] = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel in BOUNDARY:
            continue
        tree = ast.parse(f.read_text(), str(f))
        owner = _functions(tree)
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if (rel, owner.get(node)) in OTHER_SPECS:
                continue
            if isinstance(node, ast.arg) and node.arg == "spec":
                bad.append(f"{where}: takes a spec dict ({owner.get(node)})")
            key = recv = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, recv = node.slice.value, node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                key, recv = node.args[0].value, node.func.value
            if recv is not None and (ast.unparse(recv) == "spec" or key in KEYS) \
                    and (rel, ast.unparse(recv)) not in NOT_INPUTS:
                bad.append(f"{where}: {ast.unparse(node)}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("parse_params", "parse_model")
                    and (rel, owner.get(node)) not in PARSES_OTHERS
                    and rel != "kernel.py"):
                bad.append(f"{where}: parses params ({ast.unparse(node)[:60]})")
    return bad


def test_no_stage_reparses_params_or_reads_an_input_by_string_key():
    bad = boundary_violations(STAGE_DIR)
    assert bad == [], "\n".join(bad)


def test_the_check_finds_what_it_forbids(tmp_path):
    """The rule catches each pattern it names (a check that cannot fail is no check)."""
    (tmp_path / "legacy.py").write_text(
        "from workers.stages.kernel import parse_params\n"
        "def run(spec, ctx):\n"
        "    p = parse_params(object, spec.get('params'))\n"
        "    target = spec['inputs']['target']\n"
        "    return target['path'], target.get('chat_template_kwargs')\n")
    bad = boundary_violations(tmp_path)
    assert len(bad) == 6, bad  # the parameter, 2 spec reads, 2 key reads, the parse


def test_every_stage_takes_its_typed_params_and_inputs():
    """Each stage's `run` is annotated with the models the entry point parses with."""
    assert set(STAGES) == {*JOB_TYPES, "plan"}
    for name, (params_model, inputs_model) in MODELS.items():
        mod = __import__(f"workers.stages.{name}", fromlist=["run"])
        src = Path(sys.modules[mod.run.__module__].__file__ or "")
        fn = next(n for n in ast.parse(src.read_text()).body
                  if isinstance(n, ast.FunctionDef) and n.name == "run")
        got = [ast.unparse(a.annotation) if a.annotation else None for a in fn.args.args]
        assert got == [params_model.__name__, inputs_model.__name__, "StageContext"], (name, got)


def _ctx(tmp_path: Path) -> StageContext:
    return StageContext.from_spec({"out_dir": str(tmp_path / "out"),
                                   "work_dir": str(tmp_path / "w")})


@pytest.mark.parametrize("spec,code,field", [
    ({"params": {"fail": "often"}}, "invalid_params", "params.fail"),
    ({"params": {"steps": 0}}, "invalid_params", "params.steps"),
    ({"inputs": {"nothing": 1}}, "invalid_input", "inputs.nothing"),
])
def test_a_malformed_probe_spec_is_refused_naming_the_field(tmp_path, spec, code, field):
    with pytest.raises(StageError) as e:
        call("probe", spec, _ctx(tmp_path))
    assert e.value.code == code and e.value.details["errors"][0]["field"] == field
    assert e.value.message.startswith(field + ":")


@pytest.mark.parametrize("inputs,field", [
    ({"dataset": {"path": "/d", "meta": {}}}, "inputs.target"),
    ({"dataset": {"meta": {}}, "target": {"path": "/t"}}, "inputs.dataset.path"),
    ({"dataset": {"path": ""}, "target": {"path": "/t"}}, "inputs.dataset.path"),
    ({"dataset": {"path": "/d"}, "target": {"path": "/t", "config": []}}, "inputs.target.config"),
    ({"dataset": {"path": "/d"}, "target": {"path": "/t", "colour": "red"}},
     "inputs.target.colour"),
])
def test_a_malformed_resolved_input_is_refused_naming_the_field(inputs, field):
    """Before the stage runs: no stage reaches a missing key."""
    with pytest.raises(StageError) as e:
        parse("prepare", {"inputs": inputs})
    assert e.value.code == "invalid_input"
    assert [x["field"] for x in e.value.details["errors"]] == [field]


def test_typed_values_reach_the_stage(tmp_path):
    """A probe gets its params as the model (defaults filled), and the roots are checked on
    the typed inputs: a dataset outside the artifact roots is refused naming it."""
    out = call("probe", {"params": {"steps": 2, "import_torch": False}}, _ctx(tmp_path))
    assert out["torch"].startswith("not imported")
    params, inputs = parse("split", {"inputs": {"dataset": {"path": "/d", "kind": "dataset"}}})
    assert params.seed == 0 and isinstance(inputs.dataset, ResolvedArtifact)
    assert inputs.dataset.meta == {} and inputs.dataset.path == "/d"
    with pytest.raises(StageError) as e:
        call("split", {"inputs": {"dataset": {"path": "/elsewhere/d"}},
                       "roots": {"artifacts": [str(tmp_path)]}}, _ctx(tmp_path))
    assert e.value.code == "path_not_allowed" and e.value.details == {
        "param": "inputs.dataset.path"}


def test_the_stage_process_refuses_a_malformed_spec_naming_the_field(tmp_path):
    """`python -m workers.stages`: a bad input gets an error event naming the field and exit
    status 2 (a typed failure), not a crash."""
    spec = {"inputs": {"dataset": {"path": str(tmp_path)}, "target": {"config": {}}},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "workers.stages", "prepare", "--spec",
                           str(tmp_path / "spec.json")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "error [invalid_input]: inputs.target.path: Field required" in proc.stderr
    (err,) = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()
              if json.loads(x)["kind"] == "error"]
    assert err["data"]["details"]["errors"] == [{"field": "inputs.target.path",
                                                  "message": "Field required"}]
