"""Every reference field of a run body takes a name where it takes an id, in the plan and at
submit alike (app/runs/names.py, one resolver): a plan that passes never ends in a 422 on
submit (a dataset name in stages.evaluate.data used to)."""

from __future__ import annotations

import pytest

from contracts.run import field_value, reference_fields, with_field
from tests.tiny import counting_records, ingested, tiny_target, write_jsonl


@pytest.fixture(scope="module")
def named(api, home):
    t = tiny_target(api, home, "refs-target")
    ds = ingested(api, write_jsonl(home / "data" / "refs.jsonl", counting_records(40)),
                  "refs-train")
    ev = ingested(api, write_jsonl(home / "data" / "refs-eval.jsonl", counting_records(8)),
                  "refs-eval48")
    return t, ds, ev


def test_the_walk_finds_the_reference_fields_of_the_contract():
    # read from the models and the expansion (contracts/run.py), not from a list: these three
    # at least, each with the kinds its job input accepts
    fields = reference_fields()
    assert fields["target_id"] == ("target",) and fields["dataset_id"] == ("dataset",)
    assert "dataset" in fields["stages.evaluate.data"]
    assert "name" not in fields and "stages.train.tokenized" not in fields


def test_every_reference_field_takes_a_name_in_plan_and_submit(api, worker, named):
    t, ds, ev = named
    base = {"name": "refs", "target_id": t["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "draft_vocab_size": 256},
            "mode": "online",
            "stages": {"prepare": {"seq_length": 256}, "extract": None,
                       "train": {"max_steps": 2, "seq_length": 256},
                       "evaluate": {"num_prompts": 2, "max_new_tokens": 4, "data": ev["id"]}}}
    name_of = {x["id"]: x["name"] for x in named}
    for path, kinds in reference_fields().items():
        # a field this body leaves empty would be walked without being tried: give it an id
        assert field_value(base, path) in name_of, f"give {path} ({kinds}) an id in the body"
        given = field_value(base, path)
        body = with_field(base, path, name_of[given])
        plan = api.post("/v1/plans", body, timeout=300)
        assert plan.status_code == 200 and plan.json()["ok"], (path, plan.text)
        r = api.post("/v1/runs", body, timeout=300)
        assert r.status_code == 201, (path, r.text)
        run = r.json()
        api.post(f"/v1/runs/{run['id']}/cancel")
        assert field_value(run["spec"], path) == given, (path, run["spec"])  # stored as the id
        # a name that names nothing is refused by the plan, naming the field, as by submit
        bad = with_field(base, path, "no-such-thing")
        for route in ("/v1/plans", "/v1/runs"):
            r = api.post(route, bad, timeout=300)
            assert r.status_code == 422 and r.json()["error"]["param"] == path, (route, r.text)
            assert "'no-such-thing'" in r.json()["error"]["message"]


def test_evaluate_data_is_checked_by_the_plan_as_by_submit(api, worker, named):
    # an artifact id that does not exist: the plan says so, as submit would, naming the field
    t, ds, _ = named
    body = {"name": "refs-bad", "target_id": t["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash"}, "mode": "online",
            "stages": {"prepare": {"seq_length": 256}, "extract": None,
                       "evaluate": {"data": "art_00000000000000000000000000"}}}
    for route in ("/v1/plans", "/v1/runs"):
        r = api.post(route, body, timeout=300)
        e = r.json()["error"]
        assert r.status_code == 422 and e["param"] == "stages.evaluate.data", (route, r.text)
        assert e["message"].startswith("stages.evaluate.data: art_0000"), e
