"""Ingest: every real fixture file and made-up files for the shapes without a sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workers.stages import ingest
from workers.stages.common import StageContext
from workers.stages.ingest.formats import detect_one, oasst
from workers.stages.records import iter_records
from tests.stages.typed import run_stage


def run_ingest(tmp_path: Path, src: Path, name: str | None = None, **params):
    spec = {"inputs": {"source": {"path": str(src), "name": name or src.name.split(".")[0]}},
            "params": params, "out_dir": str(tmp_path / "out"), "work_dir": str(tmp_path / "work"),
            "events_path": str(tmp_path / "events.jsonl")}
    ctx = StageContext.from_spec(spec)
    try:
        result = run_stage("ingest", spec, ctx)
    finally:
        ctx.close()
    (art,) = ctx.artifacts
    folder = Path(spec["out_dir"]) / art["path"]
    return result, art["meta"], list(iter_records(folder)), folder


def write_jsonl(path: Path, objs: list) -> Path:
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), encoding="utf-8")
    return path


def roles(rec: dict) -> list[str]:
    return [m["role"] for m in rec["messages"]]


def fixture_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


U, A, S, T = "user", "assistant", "system", "tool"

# What each real fixture must give: (format, [roles per record], [ids]); counts and shapes
# checked by reading the files (see ../shared/fixtures/SOURCES.md).
EXPECTED = {
    "alpaca.jsonl": ("alpaca", [[U, A]] * 4, [f"alpaca-{i}" for i in range(1, 5)]),
    "evol_codealpaca.jsonl": ("evol_codealpaca", [[U, A]] * 2,
                              ["evol_codealpaca-1", "evol_codealpaca-2"]),
    "magicoder_oss_instruct.jsonl": ("magicoder", [[U, A]], ["4626"]),
    "oasst1_trees.jsonl": ("oasst", [[U, A], [U, A, U, A], [U, A, U, A]],
                           ["054e1df3-35e0-4bb8-a585-607dbdcd24e0",
                            "ea201f57-d24a-40f3-a0a7-ad15b893e538",
                            "44f6d71c-2b4a-4197-8afc-34bcb233b744"]),
    "openai_messages.jsonl": ("openai", [[S, U, A], [S] + [U, A] * 4, [U, A], [S, A]],
                              [f"openai_messages-{i}" for i in range(1, 5)]),
    "openorca.jsonl": ("openorca", [[U, A], [S, U, A]], ["niv.242684", "flan.564327"]),
    "sharegpt.jsonl": ("sharegpt", [[U, A] * 2, [U, A] * 3, [U, A] * 2,
                                    [U, A, U, A, T, A, U, A]],
                       ["identity_0", "identity_2", "identity_6", "sharegpt-4"]),
    "ultrachat.jsonl": ("ultrachat", [[U, A, U, A, U, A, U]], ["0"]),
}


def test_every_fixture_file_is_covered(datasets_dir):
    assert sorted(p.name for p in datasets_dir.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("fname", sorted(EXPECTED))
def test_fixture_ingests_with_format_counts_roles(tmp_path, datasets_dir, fname):
    src = datasets_dir / fname
    fmt, want_roles, want_ids = EXPECTED[fname]
    result, meta, recs, folder = run_ingest(tmp_path, src)
    assert meta["format"] == result["format"] == fmt
    assert meta["num_rejected"] == 0 and meta["rejected_sample"] == []
    assert meta["num_records"] == len(recs) == len(want_roles)
    assert [roles(r) for r in recs] == want_roles
    assert [r["id"] for r in recs] == want_ids
    stem = fname.split(".")[0]
    lines = [i for i, _ in enumerate(fixture_lines(src), 1)]
    assert [r["source"] for r in recs] == [f"{stem}:{i}" for i in lines]
    assert (folder / "rejects.jsonl").read_bytes() == b""
    assert json.loads((folder / "meta.json").read_text()) == meta
    # the stats are those of the records actually written
    st = meta["stats"]
    assert st["records"] == len(recs)
    assert st["turns"] == sum(len(r["messages"]) for r in recs)
    assert st["user_only"] == sum(r["messages"][-1]["role"] != "assistant" for r in recs)
    assert st["with_system"] == sum(S in roles(r) for r in recs)
    lengths = [sum(len(m["content"]) + len(m.get("reasoning") or "") for m in r["messages"])
               for r in recs]
    assert st["chars"] == sum(lengths)
    assert st["length_percentiles"]["max"] == max(lengths)
    assert st["length_percentiles"]["p50"] == int(np.percentile(lengths, 50, method="inverted_cdf"))


def test_fixture_contents_are_carried_exactly(tmp_path, datasets_dir):
    src = datasets_dir / "alpaca.jsonl"
    raw = fixture_lines(src)
    _, _, recs, _ = run_ingest(tmp_path, src)
    for obj, rec in zip(raw, recs):
        user = obj["instruction"] + (f"\n\n{obj['input']}" if obj["input"] else "")
        assert rec["messages"][0]["content"] == user
        assert rec["messages"][1]["content"] == obj["output"]
    assert "\n\nSide 1 = 4" in recs[3]["messages"][0]["content"]  # record 5 of the source has input


def test_openorca_empty_system_prompt_dropped(tmp_path, datasets_dir):
    src = datasets_dir / "openorca.jsonl"
    raw = fixture_lines(src)
    _, _, recs, _ = run_ingest(tmp_path, src)
    assert raw[0]["system_prompt"] == ""
    assert recs[1]["messages"][0] == {"role": "system", "content": raw[1]["system_prompt"]}
    assert recs[1]["messages"][1]["content"] == raw[1]["question"]
    assert recs[1]["messages"][2]["content"] == raw[1]["response"]


def test_sharegpt_function_call_observation_and_tools(tmp_path, datasets_dir):
    src = datasets_dir / "sharegpt.jsonl"
    raw = fixture_lines(src)[3]
    _, meta, recs, _ = run_ingest(tmp_path, src)
    rec = recs[3]
    call_turn = next(t for t in raw["conversations"] if t["from"] == "function_call")
    call = json.loads(call_turn["value"])
    msg = rec["messages"][3]
    assert msg["role"] == "assistant" and msg["content"] == ""
    assert msg["tool_calls"] == [{"type": "function", "function": {
        "name": "search_recipes", "arguments": call["arguments"]}}]
    obs = next(t for t in raw["conversations"] if t["from"] == "observation")
    assert rec["messages"][4] == {"role": "tool", "content": obs["value"], "name": "search_recipes"}
    assert rec["tools"] == [{"type": "function", "function": t} for t in json.loads(raw["tools"])]
    assert [r.get("tools") for r in recs[:3]] == [None, None, None]
    assert meta["stats"]["with_tools"] == 1


def test_oasst_follows_best_ranked_replies(tmp_path, datasets_dir):
    src = datasets_dir / "oasst1_trees.jsonl"
    trees = fixture_lines(src)
    _, _, recs, _ = run_ingest(tmp_path, src)

    def best(node):  # rank 0 among the replies, written out by hand from the fixture
        return next(r for r in node["replies"] if r.get("rank") == 0)

    for tree, rec in zip(trees, recs):
        node, want = tree["prompt"], []
        while True:
            want.append(node["text"])
            if not node.get("replies"):
                break
            node = best(node) if node["role"] == "prompter" else node["replies"][0]
        assert [m["content"] for m in rec["messages"]] == want


def test_oasst_unranked_follow_ups_give_one_path_each():
    tree = {"message_tree_id": "t1", "prompt": {
        "message_id": "r", "role": "prompter", "text": "Q?", "replies": [
            {"message_id": "a1", "role": "assistant", "text": "worse", "rank": 1},
            {"message_id": "a0", "role": "assistant", "text": "best", "rank": 0, "replies": [
                {"message_id": "p1", "role": "prompter", "text": "follow-up one"},
                {"message_id": "p2", "role": "prompter", "text": "follow-up two", "replies": [
                    {"message_id": "x", "role": "assistant", "text": "deleted", "rank": 0,
                     "deleted": True}]},
            ]},
        ]}}
    assert detect_one(tree) == "oasst"
    recs = oasst(tree)
    assert [r[0] for r in recs] == ["t1/p1", "t1/p2"]
    assert [[m[1] for m in r[1]] for r in recs] == [["Q?", "best", "follow-up one"],
                                                   ["Q?", "best", "follow-up two"]]


def test_made_up_shapes(tmp_path):
    """Formats and variants without a real sample: bare prompts, TRL prompt/completion,
    reasoning fields, think tags, tool calls, content parts, LLaMA-Factory extras."""
    objs = [
        {"prompt": "Write a haiku about rain."},
        {"text": "Summarize the French revolution."},
        {"prompt": "2+2?", "completion": "4"},
        {"prompt": [{"role": "user", "content": "hi"}],
         "completion": [{"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "developer", "content": "Be terse."},
                      {"role": "user", "content": [{"type": "text", "text": "What is "},
                                                   {"type": "text", "text": "2+2?"}]},
                      {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}]},
        {"messages": [{"role": "user", "content": "why?"},
                      {"role": "assistant", "content": "because", "reasoning_content": "hmm"}]},
        {"messages": [{"role": "user", "content": "weather in Paris?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function", "function": {
                              "name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                      {"role": "assistant", "content": "18C in Paris."}],
         "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}]},
        {"messages": [{"role": "user", "content": "and now?"},
                      {"role": "assistant", "content": "</think>only a closing tag"}]},
        {"system": "You are a pirate.", "conversations": [
            {"from": "human", "value": "hello"}, {"from": "gpt", "value": "arr"}]},
        {"conversations": [{"role": "user", "content": "role/content inside conversations"}]},
        {"instruction": "Continue.", "input": "", "output": "done", "system": "sys",
         "history": [["first q", "first a"]]},
        {"instruction": "Write a sort.", "response": "sorted()"},
        {"problem": "Reverse a list.", "solution": "xs[::-1]"},
        {"question": "Capital of France?", "response": "", "system_prompt": ""},
        {"id": "u1", "data": ["q1", "a1", "q2"]},
        {"messages": [{"role": "user", "content": "hm?"},
                      {"role": "assistant", "content": "yes", "thinking": "gpt-oss style"}]},
        {"question": "Janet has 3 apples...", "answer": "She has 3.\n#### 3"},
    ]
    _, meta, recs, _ = run_ingest(tmp_path, write_jsonl(tmp_path / "made.jsonl", objs))
    assert meta["num_rejected"] == 0 and len(recs) == len(objs)
    r = {i: rec for i, rec in enumerate(recs)}
    assert r[0]["messages"] == [{"role": "user", "content": "Write a haiku about rain."}]
    assert r[1]["messages"] == [{"role": "user", "content": "Summarize the French revolution."}]
    assert roles(r[2]) == [U, A] and r[2]["messages"][1]["content"] == "4"
    assert roles(r[3]) == [U, A]
    assert r[4]["messages"] == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning": "add them"}]
    assert r[5]["messages"][1] == {"role": "assistant", "content": "because", "reasoning": "hmm"}
    assert r[6]["messages"][1]["tool_calls"] == [{"type": "function", "id": "c1", "function": {
        "name": "weather", "arguments": {"city": "Paris"}}}]
    assert r[6]["messages"][2] == {"role": "tool", "content": "18C", "tool_call_id": "c1"}
    assert r[6]["tools"] == objs[6]["tools"]
    assert r[7]["messages"][1] == {"role": "assistant", "content": "only a closing tag"}
    assert roles(r[8]) == [S, U, A] and r[8]["messages"][0]["content"] == "You are a pirate."
    assert r[9]["messages"] == [{"role": "user", "content": "role/content inside conversations"}]
    assert [m["content"] for m in r[10]["messages"]] == ["sys", "first q", "first a", "Continue.",
                                                         "done"]
    assert roles(r[11]) == [U, A] and roles(r[12]) == [U, A]
    assert r[13]["messages"] == [{"role": "user", "content": "Capital of France?"}]  # prompt-only
    assert r[14]["id"] == "u1" and roles(r[14]) == [U, A, U]
    assert r[15]["messages"][1] == {"role": "assistant", "content": "yes",
                                    "reasoning": "gpt-oss style"}
    assert r[16]["messages"][1] == {"role": "assistant", "content": "She has 3.\n#### 3"}
    # formats seen per record (auto mode), the file's format is the most common one
    assert meta["formats"] == {"prompt": 4, "openai": 5, "sharegpt": 2, "alpaca": 1,
                               "evol_codealpaca": 1, "magicoder": 1, "openorca": 2, "ultrachat": 1}
    assert meta["format"] == "openai"
    st = meta["stats"]
    assert st["user_only"] == 5  # 0, 1, 9, 13, 14: no invented answers
    assert st["with_reasoning"] == 3 and st["with_tools"] == 1 and st["with_system"] == 3


def test_format_param_forces_and_rejects_other_shapes(tmp_path, datasets_dir):
    objs = fixture_lines(datasets_dir / "alpaca.jsonl") + [{"messages": [
        {"role": "user", "content": "not alpaca"}]}]
    src = write_jsonl(tmp_path / "forced.jsonl", objs)
    _, meta, recs, _ = run_ingest(tmp_path, src, format="evol_codealpaca")
    assert meta["format"] == "evol_codealpaca" and len(recs) == 4
    assert meta["rejected_sample"] == [{"line": 5, "reason": "record does not match format "
                                        "'evol_codealpaca' (keys: messages)"}]


def test_duplicate_ids_get_a_line_suffix(tmp_path):
    objs = [{"id": "x", "prompt": "one"}, {"id": "y", "prompt": "two"}, {"id": "x", "prompt": "3"}]
    _, meta, recs, _ = run_ingest(tmp_path, write_jsonl(tmp_path / "dups.jsonl", objs))
    assert [r["id"] for r in recs] == ["x", "y", "x#3"]
    assert meta["duplicate_ids"] == 1


def test_dataset_name_param_names_ids_and_sources(tmp_path, datasets_dir):
    _, meta, recs, _ = run_ingest(tmp_path, datasets_dir / "alpaca.jsonl", dataset_name="mine")
    assert [r["source"] for r in recs][:2] == ["mine:1", "mine:2"]
    assert recs[0]["id"] == "mine-1" and meta["source"]["name"] == "mine"


def test_one_list_of_formats_for_the_stage_the_api_and_the_cli():
    """contracts/ingest.py lists the formats; the stage, the API and the CLI derive theirs."""
    import typer.main

    from app.cli.main import cli
    from app.core.errors import Invalid
    from app.datasets import service
    from app.datasets.routes import UPLOAD_BODY, DatasetFromPath
    from contracts.ingest import FORMAT_CHOICES, FORMATS, IngestParams
    from workers.stages.ingest.formats import NORMALIZERS

    assert FORMAT_CHOICES == ("auto", *FORMATS) and set(NORMALIZERS) == set(FORMATS)
    assert ingest.FORMATS == FORMATS
    for f in FORMAT_CHOICES:
        assert service._check_format(f) == IngestParams(format=f).format == f
    with pytest.raises(Invalid) as e:
        service._check_format("csv")
    assert e.value.code == "unknown_format" and ", ".join(FORMAT_CHOICES) in e.value.message
    form = UPLOAD_BODY["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["format"]["enum"] == list(FORMAT_CHOICES)
    assert DatasetFromPath.model_json_schema()["properties"]["format"]["enum"] == \
        list(FORMAT_CHOICES)
    # The CLI lists the formats in `dataset --help` (made when shown: app/cli/view.help_later),
    # and its --format option points there.
    command = typer.main.get_command(cli).commands["dataset"]
    assert "formats: " + " | ".join(FORMATS) in command.help
    (fmt,) = [p for p in command.params if p.name == "fmt"]
    assert "listed above" in fmt.help
