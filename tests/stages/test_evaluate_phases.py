"""evaluate on a mixed evaluation set: its progress names each phase and its place (the bar
restarts at each), its report splits tau by source dataset, and given data is named by its
dataset's name. One run of the stage on the tiny target with an untrained drafter."""

from __future__ import annotations

import json

import pytest

from tests.stages.conftest import target_input
from tests.stages.evaluate_support import make_drafter
from workers.stages.common import StageContext
from tests.stages.typed import run_stage
from tests.stages.records_support import write_dataset

PHASES = ["reference answers", "target alone", "with the drafter", "with the baseline",
          "with the prompt lookup", "tau_sim", "tau_sim baseline"]


def _mixed(folder, per_source: int = 2) -> None:
    """Records as a mix writes them: `source` keeps `<dataset name>:<line>`."""
    recs = []
    for i in range(per_source):
        recs.append({"id": f"code/r{i}", "source": f"humaneval:{i + 1}", "messages": [
            {"role": "user", "content": f"Write a function number {i} that adds two ints."},
            {"role": "assistant", "content": "def add(a, b):\n    return a + b"}]})
        recs.append({"id": f"chat/r{i}", "source": f"sharegpt:{i + 7}", "messages": [
            {"role": "user", "content": f"Tell me about rivers, part {i}."},
            {"role": "assistant", "content": "Rivers carry water to the sea."}]})
    write_dataset(folder, recs)


def test_phases_named_in_progress_and_tau_split_by_source(tiny_target, tmp_path):
    drafter = tmp_path / "drafter"
    make_drafter(tiny_target, "dflash").save_pretrained(drafter)
    _mixed(tmp_path / "ds")
    data = {"path": str(tmp_path / "ds"), "kind": "dataset", "id": "art_x",
            "dataset_id": "ds_mixed", "name": "eval-mixed",
            "meta": {"chat_template_kwargs": {"enable_thinking": False}, "num_records": 4}}
    spec = {"inputs": {"target": target_input(tiny_target),
                       "drafter": {"path": str(drafter), "meta": {}}, "data": data},
            "params": {"num_prompts": 4, "max_new_tokens": 6, "evaluated_on": "given",
                       "chat_template_kwargs": {"enable_thinking": False}},
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}
    ctx = StageContext.from_spec(spec)
    try:
        run_stage("evaluate", spec, ctx)
    finally:
        ctx.close()

    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    prog = [e["data"] for e in events if e["kind"] == "progress"]
    seen = [p["phase"] for i, p in enumerate(prog) if i == 0 or prog[i - 1]["phase"] != p["phase"]]
    assert seen == PHASES, seen  # each phase once, in order
    for p in prog:
        k = PHASES.index(p["phase"]) + 1
        assert (p["phase_index"], p["phases"]) == (k, len(PHASES))
        assert p["stage"] == f"evaluate: {p['phase']} ({k}/{len(PHASES)})"
    # Each phase starts at 0 (the bar and the rate restart there) and ends at its total.
    for name in PHASES:
        mine = [p for p in prog if p["phase"] == name]
        assert mine[0]["done"] == 0 and mine[-1]["done"] == mine[-1]["total"] > 0, mine

    report = json.loads((tmp_path / "out" / "report" / "report.json").read_text())
    by = report["by_source"]
    assert set(by) == {"humaneval", "sharegpt"}, by
    assert all(b["prompts"] == 2 and b["tau"] is not None and b["tau_baseline"] is not None
               for b in by.values()), by
    # A source's tau is over its own steps: the steps add up, and so do the accepted drafts.
    assert sum(b["steps"] for b in by.values()) == report["steps"]
    assert sum((b["tau"] - 1) * b["steps"] for b in by.values()) == \
        pytest.approx((report["tau"] - 1) * report["steps"])
    assert report["evaluated_on"] == "on the evaluation data given (eval-mixed, ds_mixed, 4 records)"


def test_tau_by_source_and_source_names():
    from workers.stages.evaluate.data import source_name
    from workers.stages.evaluate.specdec import tau_by_source

    assert source_name("sharegpt:12") == "sharegpt" and source_name("a:b:3") == "a:b"
    assert source_name(None) == "" and source_name("plain") == "plain"
    by = tau_by_source(["a", "b", "a"], {"tau": [[1, 3], [0], [2]]})
    assert by == {"a": {"prompts": 2, "tau": 3.0, "steps": 3},
                  "b": {"prompts": 1, "tau": 1.0, "steps": 1}}
