"""Mix: weights, caps, dedupe on the normalized prompt, seeded order, lineage."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from workers.stages.common import StageContext, StageError
from workers.stages.records import DATA_FILE, iter_records
from tests.stages.records_support import dataset_stats, write_dataset
from tests.stages.typed import run_stage

from .test_ingest_formats import run_ingest


def conv(name, i, prompt, answer="ok", system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return {"id": f"{name}-{i}", "source": f"{name}:{i + 1}", "messages": msgs}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A: 100 distinct prompts. B: 50, of which 10 repeat A's prompts with other whitespace
    and other answers. C: 40: "c 0".."c 34", then "c 0".."c 3" again (4 duplicates), and A's
    "question 0" under a system prompt (a different prompt)."""
    root = tmp_path_factory.mktemp("mix_sources")
    a = [conv("A", i, f"question {i}") for i in range(100)]
    b = [conv("B", i, f"  question\n {i} ", answer="other") for i in range(10)] + \
        [conv("B", i, f"b question {i}") for i in range(10, 50)]
    c = [conv("C", i, f"c {i % 35}") for i in range(39)] + \
        [conv("C", 39, "question 0", system="be brief")]
    dirs = {}
    for name, recs in (("A", a), ("B", b), ("C", c)):
        dirs[name] = root / name
        write_dataset(dirs[name], recs)
    return dirs


def run_mix(tmp_path: Path, sources: list[dict], **params):
    spec = {"inputs": {"sources": sources}, "params": params,
            "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work")}
    ctx = StageContext.from_spec(spec)
    result = run_stage("mix", spec, ctx)
    (art,) = ctx.artifacts
    folder = Path(spec["out_dir"]) / art["path"]
    return result, art["meta"], list(iter_records(folder)), folder


def srcs(dirs, wa=0.5, wb=None, wc=2.0, cap_b=30):
    return [{"path": str(dirs["A"]), "dataset_id": "ds_a", "name": "A", "weight": wa},
            {"path": str(dirs["B"]), "dataset_id": "ds_b", "name": "B", "weight": wb,
             "max_records": cap_b},
            {"path": str(dirs["C"]), "dataset_id": "ds_c", "name": "C", "weight": wc}]


def by_source(recs):
    return Counter(r["id"].split("/")[0] for r in recs)


def test_weights_caps_and_dedupe_give_the_expected_counts(tmp_path, three):
    result, meta, recs, folder = run_mix(tmp_path, srcs(three), seed=0)
    # C: 39 records "c {i % 35}" give 35 distinct + 4 repeats, plus the system one: 36 unique
    lineage = {s["dataset_id"]: s for s in meta["sources"]}
    assert {k: (v["records"], v["unique"], v["duplicates_dropped"], v["taken"])
            for k, v in lineage.items()} == {
        "ds_a": (100, 100, 0, 50),   # round(0.5 * 100)
        "ds_b": (50, 40, 10, 30),    # 40 after dedupe, capped at 30
        "ds_c": (40, 36, 4, 72),     # 2.0 * 36: every record twice
    }
    assert meta["num_records"] == result["num_records"] == len(recs) == 152
    assert by_source(recs) == {"A": 50, "B": 30, "C": 72}
    ids = [r["id"] for r in recs]
    assert len(set(ids)) == len(ids)
    # C's upsampled copies carry #1 and are the only repeated prompts
    copies = [i for i in ids if i.endswith("#1")]
    assert len(copies) == 36 and all(i.startswith("C/") for i in copies)
    prompts = Counter(tuple((m["role"], " ".join(m["content"].split()))
                            for m in r["messages"][:-1]) for r in recs)
    assert set(prompts.values()) == {1, 2}
    assert sum(v == 2 for v in prompts.values()) == 36
    # B's first 10 repeat A's prompts up to whitespace: dropped, though their answers differ
    assert not [r for r in recs if r["id"].startswith("B/") and int(r["id"].split("-")[1]) < 10]
    # lineage: ids are prefixed source ids, `source` still points at the original line
    a = next(r for r in recs if r["id"].startswith("A/"))
    n = int(a["id"].split("-")[1])
    assert a["id"] == f"A/A-{n}" and a["source"] == f"A:{n + 1}"
    assert a["messages"][0]["content"] == f"question {n}"
    # the A sample is 50 distinct records of A
    a_ids = {r["id"] for r in recs if r["id"].startswith("A/")}
    assert len(a_ids) == 50 and a_ids <= {f"A/A-{i}" for i in range(100)}
    assert meta["stats"] == dataset_stats(folder)
    assert meta["stats"]["records"] == 152 and meta["stats"]["turns"] == 150 * 2 + 2 * 3


def test_same_seed_same_dataset_other_seed_other_sample_and_order(tmp_path, three):
    _, _, r1, f1 = run_mix(tmp_path / "s0", srcs(three), seed=0)
    _, _, r2, f2 = run_mix(tmp_path / "s0b", srcs(three), seed=0)
    _, _, r3, _ = run_mix(tmp_path / "s1", srcs(three), seed=1)
    assert r1 == r2
    assert pq.read_table(f1 / DATA_FILE).equals(pq.read_table(f2 / DATA_FILE))
    ids1, ids3 = [r["id"] for r in r1], [r["id"] for r in r3]
    assert ids1 != ids3 and len(ids3) == len(ids1)
    a1 = {i for i in ids1 if i.startswith("A/")}
    a3 = {i for i in ids3 if i.startswith("A/")}
    assert a1 != a3  # another sample of A
    assert by_source(r3) == by_source(r1)  # the same counts


def test_order_interleaves_the_sources(tmp_path, three):
    _, _, recs, _ = run_mix(tmp_path, srcs(three), seed=0)
    labels = [r["id"][0] for r in recs]
    assert len(set(labels[:20])) == 3  # not one source after the other
    for name in "ABC":  # each source's records keep their stored order (first pass)
        rows = [int(r["id"].split("-")[1]) for r in recs
                if r["id"].startswith(f"{name}/") and "#" not in r["id"]]
        assert rows == sorted(rows)


def test_total_cap_scales_sources_in_proportion(tmp_path, three):
    _, meta, recs, _ = run_mix(tmp_path, srcs(three), seed=3, max_records=60)
    # 50 : 30 : 72 of 152 scaled to 60 -> 19.74, 11.84, 28.42 -> floors 19, 11, 28 (58);
    # the two largest remainders (B .84, A .74) get one more
    assert [s["taken"] for s in meta["sources"]] == [20, 12, 28]
    assert by_source(recs) == {"A": 20, "B": 12, "C": 28} and len(recs) == 60
    assert all("#" not in r["id"] for r in recs)  # 28 < 36: C is sampled, not repeated


def test_without_dedupe_everything_counts(tmp_path, three):
    _, meta, recs, _ = run_mix(tmp_path, srcs(three, wa=None, wc=None, cap_b=None), dedupe=False)
    assert [(s["duplicates_dropped"], s["taken"]) for s in meta["sources"]] == [
        (0, 100), (0, 50), (0, 40)]
    assert len(recs) == 190


def test_weight_zero_and_name_clash(tmp_path, three):
    sources = [{"path": str(three["A"]), "dataset_id": "x", "name": "same", "weight": 0.1},
               {"path": str(three["B"]), "dataset_id": "y", "name": "same", "weight": 0}]
    _, meta, recs, _ = run_mix(tmp_path, sources)
    assert [s["prefix"] for s in meta["sources"]] == ["same", "same.2"]
    assert [s["taken"] for s in meta["sources"]] == [10, 0] and len(recs) == 10


def test_mix_of_ingested_fixtures(tmp_path, datasets_dir):
    """End to end: two ingest artifacts mixed; the records and lineage survive."""
    _, m1, r1, d1 = run_ingest(tmp_path / "i1", datasets_dir / "sharegpt.jsonl")
    _, m2, r2, d2 = run_ingest(tmp_path / "i2", datasets_dir / "openai_messages.jsonl")
    _, meta, recs, _ = run_mix(tmp_path / "m", [
        {"path": str(d1), "dataset_id": "d1", "name": "sharegpt"},
        {"path": str(d2), "dataset_id": "d2", "name": "openai"}], seed=5)
    # identity_0 and identity_6 differ only after the first user turn... their first prompt
    # differs ("Who are you?" vs "What is your name?"), so nothing is a duplicate
    assert meta["num_records"] == len(r1) + len(r2) == 8
    by_id = {r["id"]: r for r in recs}
    assert by_id["sharegpt/identity_0"]["messages"] == r1[0]["messages"]
    assert by_id["sharegpt/sharegpt-4"]["tools"] == r1[3]["tools"]
    assert by_id["openai/openai_messages-4"]["source"] == "openai_messages:4"
    assert meta["stats"]["with_tools"] == 1 and meta["stats"]["with_system"] == 3


@pytest.mark.parametrize("sources, params, code, field", [
    ([{"path": "X", "weight": -1}], {}, "invalid_input", "inputs.sources.0.weight"),
    ([], {}, "invalid_input", "inputs.sources"),
    ([{"path": "/nonexistent/ds"}], {}, "invalid_input", "inputs.sources.0.path"),
    ([{"path": "X"}], {"seed": "abc"}, "invalid_params", "params.seed"),
    ([{"path": "X"}], {"seed": -1}, "invalid_params", "params.seed"),
    ([{"path": "X", "weight": float("inf")}], {}, "invalid_input", "inputs.sources.0.weight"),
    ([{"path": "X"}], {"max_records": 0}, "invalid_params", "params.max_records"),
    ([{"path": "X"}], {"shuffle": True}, "invalid_params", "params.shuffle"),
])
def test_invalid_inputs(tmp_path, three, sources, params, code, field):
    sources = [{**s, "path": str(three["A"]) if s["path"] == "X" else s["path"]} for s in sources]
    with pytest.raises(StageError) as e:
        run_mix(tmp_path, sources, **params)
    assert e.value.code == code and e.value.message.startswith(field)
    assert e.value.details["errors"][0]["field"] == field
