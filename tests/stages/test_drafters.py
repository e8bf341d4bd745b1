"""One drafter registry (contracts/drafters.py): every list of drafter types derives from it,
and a type registered in one place is taken by the run body, the plan, train's params, the
evaluate stage, vLLM's serve line and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from app.cli.initrun import starting_body
from app.cli.main import cli
from app.core.errors import Invalid
from app.runs.schemas import RunCreate
from app.runs.service import check_params
from contracts.drafters import (DRAFTERS, DrafterDef, DrafterOptions, default_layer_ids,
                                option_fields, registered, target_problem)
from contracts.extract import ExtractParams
from contracts.run import RunSpec
from contracts.train import DrafterParams, TrainParams
from workers.stages.common import StageError
from workers.stages.evaluate import drafter as eval_drafter
from workers.stages.evaluate.proposers import PROPOSERS
from workers.stages.evaluate.vllm_metrics import serve_command
from workers.stages.extract.layers import resolve_layers
from workers.stages.train.build import RECIPES
from tests.stages.test_run_expansion import TARGET, _plan, _run


def _enum(model, *path: str) -> list[str]:
    schema = model.model_json_schema()
    node = schema
    for p in path:
        if p not in node:  # a referenced model, or an optional one (anyOf [ref, null])
            ref = node.get("$ref") or next(o["$ref"] for o in node["anyOf"] if "$ref" in o)
            node = schema["$defs"][ref.split("/")[-1]]
        node = node[p]
    return node["enum"]


def test_every_list_of_drafter_types_is_the_registry():
    types = list(DRAFTERS)
    assert types == ["dflash", "eagle3", "peagle", "dspark", "mtp"]
    assert _enum(ExtractParams, "properties", "drafter_type") == types
    assert _enum(DrafterParams, "properties", "type") == types
    assert _enum(RunSpec, "properties", "drafter", "properties", "type") == types
    # What each stage maps a type's keys to covers every type.
    assert {d.train for d in DRAFTERS.values()} <= set(RECIPES)
    assert {d.evaluate for d in DRAFTERS.values()} <= set(PROPOSERS)
    # A type's own options are DrafterParams fields (the bounds live there).
    assert option_fields() <= set(DrafterParams.model_fields)
    for name, d in DRAFTERS.items():
        assert d.options.model_fields, name
        assert d.speculative_config(3) == {"method": d.vllm_method, "num_speculative_tokens": 3,
                                           **d.vllm_options}


class FakeOptions(DrafterOptions):
    ttt_steps: int = 2

    def speculative_tokens(self) -> int:
        return self.ttt_steps + 1


# A made-up drafter: EAGLE-3's train recipe and proposer, its own layers, options, method and
# training mode. Registered here and nowhere else.
FAKE = DrafterDef("fakedraft", FakeOptions, lambda n: [1, n - 2], draft_arch="llama",
                  modes=frozenset({"online"}), train="eagle3", evaluate="eagle3",
                  vllm_method="fake_method")


@pytest.fixture
def fake():
    with registered(FAKE) as d:
        yield d
    assert "fakedraft" not in DRAFTERS


def test_a_drafter_registered_in_one_place_is_taken_everywhere(fake, tmp_path):
    # the run body, its expansion and every stage's params (what POST /v1/runs checks)
    run = _run(drafter={"type": "fakedraft", "draft_vocab_size": 256}, mode="online",
               stages={"extract": None})
    jobs = {j.stage: j for j in check_params(RunCreate.model_validate(run))}
    assert jobs["train"].params["drafter"]["type"] == "fakedraft"
    assert ExtractParams(drafter_type="fakedraft").drafter_type == "fakedraft"
    # its training modes: offline is refused, naming the field
    with pytest.raises(Invalid) as e:
        check_params(RunCreate.model_validate(_run(drafter={"type": "fakedraft"})))
    assert e.value.param.startswith("stages.train") and "trains online only" in e.value.message
    # the plan resolves its default layers against the target
    assert default_layer_ids("fakedraft", 8) == [1, 6]
    assert resolve_layers(TARGET["config"], "fakedraft", None).aux == (1, 6)
    checks = _plan(run, tmp_path)
    assert checks["train_params"]["ok"] and checks["drafter_params"]["ok"]
    assert checks["layer_ids"]["message"].startswith("layers [1, 6]")
    # train's params: its options and defaults, another type's options refused
    p = TrainParams.model_validate({"mode": "online", "drafter": {"type": "fakedraft"}})
    assert (p.drafter.ttt_steps, p.drafter.speculative_tokens, p.loss_fn) == (2, 3, "kl_div")
    assert p.drafter.block_size is None
    with pytest.raises(ValueError, match="block_size applies to dflash and dspark only"):
        DrafterParams(type="fakedraft", block_size=4)
    # evaluate: a checkpoint of the type is read through its proposer's layout
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "speculators_model_type": "fakedraft", "eagle_aux_hidden_state_layer_ids": [1, 6],
        "transformer_layer_config": {"hidden_size": 64, "vocab_size": 151936},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]}}))
    spec = eval_drafter.read_drafter(ckpt)
    assert (spec.kind, spec.aux_layer_ids, spec.num_speculative_tokens) == \
        ("fakedraft", [1, 6], 3)
    assert PROPOSERS[DRAFTERS[spec.kind].evaluate].kind == "eagle3"
    # vLLM serves it with its method
    cmd = serve_command("/t", "/d", "fakedraft", 3, 8000)
    cfg = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert cfg == {"model": "/d", "method": "fake_method", "num_speculative_tokens": 3}
    # the CLI's init-run takes it
    body = starting_body({"id": "tgt_x"}, {"id": "ds_x", "name": "d"}, "fakedraft")
    assert RunCreate.model_validate(body).drafter.type == "fakedraft"
    out = tmp_path / "run.json"
    out.write_text("{}")
    res = CliRunner().invoke(cli, ["init-run", "t", "d", "-o", str(out), "--drafter",
                                   "fakedraft"])
    assert res.exit_code == 2 and "exists already" in res.output  # past the drafter check
    res = CliRunner().invoke(cli, ["init-run", "t", "d", "-o", str(out), "--drafter", "nope"])
    assert res.exit_code == 2 and "fakedraft" in res.output and "nope" in res.output


def test_an_unknown_type_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="drafter type 'nope' is not one of: dflash, eagle3"):
        RunCreate.model_validate(_run(drafter={"type": "nope"}))
    with pytest.raises(StageError) as e:
        resolve_layers(TARGET["config"], "nope", None)
    assert e.value.code == "invalid_params" and "dflash, eagle3" in e.value.message


def test_product_code_outside_contracts_spells_no_drafter_type():
    """A drafter type is named in contracts/drafters.py alone (docs/STYLE.md rule 18): code
    elsewhere reads DRAFTERS, DEFAULT_DRAFTER or Impl, so a string literal equal to a type
    name there is a second list (docstrings aside)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = set(DRAFTERS)
    found = []
    for top in ("app", "workers", "draftyard", "procgroup"):
        for f in sorted((root / top).rglob("*.py")):
            tree = ast.parse(f.read_text(), str(f))
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef
                                  | ast.AsyncFunctionDef)
                    and n.body and isinstance(n.body[0], ast.Expr)
                    and isinstance(n.body[0].value, ast.Constant)}
            found += [f"{f.relative_to(root)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in names and id(n) not in docs]
    assert not found, "drafter types spelled outside contracts/:\n" + "\n".join(found)


def test_mtp_is_refused_by_the_plan_on_a_target_without_mtp_layers(tmp_path):
    """MTP fine-tunes the target's own MTP layers: a target config without
    `mtp_num_hidden_layers` cannot have it, and the plan's check says why."""
    checks = _plan(_run(drafter={"type": "mtp", "draft_vocab_size": None}), tmp_path)
    assert not checks["drafter_params"]["ok"]
    assert "mtp_num_hidden_layers=None" in checks["drafter_params"]["message"]
    assert target_problem("mtp", {"text_config": {"mtp_num_hidden_layers": 1}}) is None
    assert target_problem("dflash", TARGET["config"]) is None
