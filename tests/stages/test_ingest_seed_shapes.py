"""Ingest of the seed datasets' native shapes that it learned at the seeds' scale: the flat
OpenAssistant message export (one row per message, as jsonl and as the HF parquet with its
float `rank` column) and LIMA's `conversations` as a list of strings."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.stages.test_ingest_formats import fixture_lines, roles, run_ingest, write_jsonl


def _flatten(tree: dict) -> list[dict]:
    """The tree export -> the flat export's rows (parents first, as the official dump)."""
    rows, stack = [], [(tree["prompt"], None)]
    while stack:
        node, parent = stack.pop(0)
        row = {k: v for k, v in node.items() if k != "replies"}
        rows.append({**row, "parent_id": parent, "message_tree_id": tree["message_tree_id"],
                     "rank": node.get("rank")})
        stack.extend((r, node["message_id"]) for r in node.get("replies") or ())
    return rows


def _records(recs: list[dict]) -> list:
    return [(r["id"], [(m["role"], m["content"]) for m in r["messages"]]) for r in recs]


def test_flat_oasst_export_gives_the_tree_exports_records(tmp_path, datasets_dir):
    src = datasets_dir / "oasst1_trees.jsonl"
    _, tree_meta, tree_recs, _ = run_ingest(tmp_path / "trees", src, name="oa")
    flat = [row for tree in fixture_lines(src) for row in _flatten(tree)]
    assert len(flat) > len(tree_recs)  # several messages per record
    _, meta, recs, _ = run_ingest(tmp_path / "flat", write_jsonl(tmp_path / "oa.jsonl", flat),
                                  name="oa")
    assert meta["format"] == "oasst_flat" and meta["num_rejected"] == 0
    assert _records(recs) == _records(tree_recs)

    # The HF parquet: rank is a float column, NaN (null) where unranked, rows in any order
    # within a tree.
    table = pa.Table.from_pylist([{**r, "rank": None if r["rank"] is None else float(r["rank"])}
                                  for r in reversed(flat)])
    pq.write_table(table, tmp_path / "oa.parquet")
    _, meta, recs, _ = run_ingest(tmp_path / "pq", tmp_path / "oa.parquet", name="oa")
    assert meta["container"] == "parquet" and meta["num_rejected"] == 0
    assert sorted(_records(recs)) == sorted(_records(tree_recs))


def test_flat_oasst_orphans_are_rejected_with_their_line(tmp_path):
    rows = [{"message_id": "a", "parent_id": None, "role": "prompter", "text": "Hi?",
             "message_tree_id": "t1"},
            {"message_id": "b", "parent_id": "a", "role": "assistant", "text": "Hello.",
             "message_tree_id": "t1", "rank": 0},
            {"message_id": "c", "parent_id": "zz", "role": "assistant", "text": "Lost.",
             "message_tree_id": "t1"},
            # no tree ids: a row without a parent starts the next tree
            {"message_id": "d", "parent_id": None, "role": "prompter", "text": "Q2"},
            {"message_id": "e", "parent_id": "d", "role": "assistant", "text": "A2"}]
    _, meta, recs, folder = run_ingest(tmp_path, write_jsonl(tmp_path / "f.jsonl", rows))
    assert [roles(r) for r in recs] == [["user", "assistant"]] * 2
    assert [r["messages"][0]["content"] for r in recs] == ["Hi?", "Q2"]
    (rej,) = [json.loads(x) for x in (folder / "rejects.jsonl").read_text().splitlines()]
    assert rej["line"] == 3 and "parent zz is not among the rows of its tree" in rej["reason"]


def test_lima_conversations_of_strings_alternate_user_assistant(tmp_path):
    rows = [{"conversations": ["How do I sort a list?", "Use sorted()."], "source": "stackexchange"},
            {"conversations": ["Q1", "A1", "Q2", "A2"], "source": "wikihow"},
            {"conversations": ["Only a prompt"], "source": "multi_turn"},
            {"conversations": ["Q", 3], "source": "broken"}]
    _, meta, recs, _ = run_ingest(tmp_path, write_jsonl(tmp_path / "lima.jsonl", rows))
    assert meta["format"] == "sharegpt"
    assert [roles(r) for r in recs] == [["user", "assistant"], ["user", "assistant"] * 2, ["user"]]
    assert recs[1]["messages"][3]["content"] == "A2"
    assert meta["num_rejected"] == 1 and "turn 2" in meta["rejected_sample"][0]["reason"]
