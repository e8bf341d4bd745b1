"""Prepare builds the rows of generated turns from the target's own token ids
(workers/stages/prepare/tokenrows.py; docs/FIELD-NOTES.md "Generation": decoding and re-tokenizing
the text does not round-trip).

Real parts: the trained demo target (tiny Qwen3, real Qwen3 tokenizer and template) answers
prompt-only, multi-turn and tool-call records in a real generate run; prepare reads that
artifact as a run hands it over. The text path on the same data (`use_token_ids: false`, what
prepare did before) is measured beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.stages.conftest import target_input
from tests.stages.generate_support import make_spec, read_output, run_stage
from workers.stages.common import StageContext
from tests.stages.typed import run_stage as run_typed
from workers.stages.prepare.tokenrows import encode_token_turns

NO_THINK = {"enable_thinking": False}
MAX_NEW = 32
TOPICS = ["a list", "a file", "a dict", "a string", "a socket", "a thread", "a queue",
          "a date", "a path", "a number", "a set", "a tuple"]


def _records() -> list[dict]:
    out: list[dict] = []
    for i, topic in enumerate(TOPICS):
        ask = {"role": "user", "content": f"Write a Python helper {i} that handles {topic}."}
        msgs: list[dict]
        if i % 3 == 0:
            msgs = [ask]
        elif i % 3 == 1:
            msgs = [ask, {"role": "assistant", "content": "def helper(): pass"},
                    {"role": "user", "content": "Now add a docstring."}]
        else:
            msgs = [ask, {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "lookup",
                                                  "arguments": {"topic": topic}}}]},
                    {"role": "tool", "name": "lookup", "content": f"{topic}: see the docs"}]
        out.append({"id": f"r{i}", "source": f"t:{i + 1}", "messages": msgs})
    return out


@pytest.fixture(scope="module")
def generated(demo_target, tmp_path_factory):
    """A real generate run's dataset artifact (folder, meta) and its token rows by (id, turn)."""
    spec = make_spec(tmp_path_factory.mktemp("gen"), _records(), target_input(demo_target),
                     max_tokens=MAX_NEW, batch_size=8, chat_template_kwargs=NO_THINK)
    run_stage(spec)
    recs, toks, fails, meta = read_output(spec)
    assert fails == [] and len(recs) == len(TOPICS)
    return Path(spec["out_dir"]) / "dataset", meta, toks


def _prepare(tmp: Path, target: Path, ds_folder: Path, ds_meta: dict, **params):
    spec: dict = {"inputs": {"dataset": {"path": str(ds_folder), "meta": ds_meta},
                             "target": target_input(target)},
                  "params": {"chat_template_kwargs": NO_THINK, **params},
                  "out_dir": str(tmp / "out"), "work_dir": str(tmp / "work"),
                  "events_path": str(tmp / "events.jsonl")}
    ctx = StageContext.from_spec(spec)
    try:
        summary = run_typed("prepare", spec, ctx)
    finally:
        ctx.close()
    from datasets import load_from_disk

    art = ctx.artifacts[0]
    folder = Path(spec["out_dir"]) / art["path"]
    rows = [(r["id"], list(r["input_ids"]), list(r["loss_mask"]))
            for r in load_from_disk(str(folder)).with_format(None)]
    return summary, art["meta"], rows, folder


@pytest.fixture(scope="module")
def prepared(demo_target, generated, tmp_path_factory):
    """(new rows, old text-path rows) over the same generated dataset."""
    folder, meta, _ = generated
    new = _prepare(tmp_path_factory.mktemp("new"), demo_target, folder, meta)
    old = _prepare(tmp_path_factory.mktemp("old"), demo_target, folder, meta,
                   use_token_ids=False)
    return new, old


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask, [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _turn_reproduced(rows, rid: str, t: dict) -> bool:
    """Some row of the record begins with exactly prompt_ids + completion_ids and trains
    exactly the completion there (nothing of the prompt's last stretch)."""
    p, c = list(t["prompt_ids"]), list(t["completion_ids"])
    for r_id, ids, mask in rows:
        if r_id == rid and ids[:len(p) + len(c)] == p + c and \
                (len(p), len(p) + len(c)) in _runs(mask):
            return True
    return False


def test_rows_are_the_targets_prompt_and_completion_ids(generated, prepared):
    _, _, toks = generated
    (summary, meta, rows, folder), _ = prepared
    by_id: dict[str, list[dict]] = {}
    for (rid, _turn), t in sorted(toks.items()):
        by_id.setdefault(rid, []).append(t)
    assert sum(len(v) > 1 for v in by_id.values()) == 4   # the multi-turn records

    # Every row is one generated turn's prompt_ids + completion_ids, exactly, and trains
    # exactly that completion; every generated turn is trained once.
    trained: list[tuple[str, int]] = []
    for rid, ids, mask in rows:
        turn = next(t for t in by_id[rid]
                    if ids == list(t["prompt_ids"]) + list(t["completion_ids"]))
        n_p = len(turn["prompt_ids"])
        assert mask == [0] * n_p + [1] * len(turn["completion_ids"])
        trained.append((rid, turn["turn"]))
    assert sorted(trained) == sorted(toks)
    # An end-of-turn token the target emitted is the completion's last id, so it is trained
    # as the text path trains it (the demo target rarely stops within MAX_NEW; the kept
    # history test below trains one).
    eos = {151643, 151645}  # <|endoftext|>, <|im_end|>
    assert all(t["completion_ids"][-1] in eos for t in toks.values()
               if t["finish_reason"] == "stop")

    # Qwen3's template renders an earlier answer without the empty think block it was
    # generated after: each turn of a multi-turn record is a row of its own.
    assert len(rows) == len(toks) == summary["num_rows"]
    assert meta["rows_from_token_ids"] == len(rows) and meta["rows_from_text"] == 0
    assert meta["token_ids"] == {"used": True, "records": len(by_id), "turns": len(toks)}
    assert meta["num_records_kept"] == len(TOPICS) and meta["num_rejected"] == 0
    assert meta["num_masked_tokens"] == sum(len(t["completion_ids"]) for t in toks.values())


def test_old_text_path_rows_differ_from_the_targets_ids(generated, prepared):
    """The measured count: generated turns whose exact ids are not a trained row."""
    _, _, toks = generated
    (_, _, new_rows, _), (_, old_meta, old_rows, _) = prepared
    new_bad = [k for k, t in toks.items() if not _turn_reproduced(new_rows, k[0], t)]
    old_bad = [k for k, t in toks.items() if not _turn_reproduced(old_rows, k[0], t)]
    # the ids alone, whatever the mask: a row beginning with prompt_ids + completion_ids
    old_ids_bad = [k for k, t in toks.items() if not any(
        r_id == k[0] and ids[:len(t["prompt_ids"]) + len(t["completion_ids"])]
        == list(t["prompt_ids"]) + list(t["completion_ids"]) for r_id, ids, _ in old_rows)]
    print(f"\ngenerated turns not reproduced exactly (ids and mask): text path {len(old_bad)} "
          f"of {len(toks)} ({sorted(old_bad)}), token ids {len(new_bad)} of {len(toks)}; "
          f"text path rows lacking the turn's ids at all: {len(old_ids_bad)} "
          f"({sorted(old_ids_bad)})")
    assert new_bad == []
    assert old_bad, "the text path reproduced every turn: the measurement lost its point"
    assert old_meta["rows_from_text"] == len(old_rows) and old_meta["rows_from_token_ids"] == 0
    assert old_meta["token_ids"]["used"] is False


END_IDS = (151643, 151645)  # <|endoftext|>, <|im_end|>


def _greedy_mismatches(model, tok_rows, drop_end: bool = False,
                       memo: dict | None = None) -> list[tuple[str, int]]:
    """Trained runs that do not equal the target's greedy continuation of the tokens before
    them (unbatched, the run's length); drop_end: a run's final end-of-turn token is left
    out of the comparison. `memo` keeps the continuations generated, by context, across
    calls: greedy decoding of n tokens is the first n of any longer greedy decoding of the
    same context (the same forwards, step by step), so a context is generated once."""
    import torch

    memo = {} if memo is None else memo
    bad = []
    for rid, ids, mask in tok_rows:
        for a, b in _runs(mask):
            if drop_end and b - a > 1 and ids[b - 1] in END_IDS:
                b -= 1
            got = memo.get(tuple(ids[:a]))
            if got is None or len(got) < b - a:   # none yet, or shorter (or ended early)
                inp = torch.tensor([ids[:a]])
                with torch.inference_mode():
                    out = model.generate(inp, attention_mask=torch.ones_like(inp),
                                         do_sample=False, max_new_tokens=b - a, pad_token_id=0)
                got = memo[tuple(ids[:a])] = out[0, a:].tolist()
            if got[:b - a] != ids[a:b]:
                bad.append((rid, a))
    return bad


def test_greedy_continuation_of_every_row_prefix_is_its_trained_answer(demo_target, prepared):
    """The hybrid test's check: the target, greedy from a row's context, writes the row's
    trained answer; on the text path it does not always."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(demo_target, dtype=torch.float32).eval()
    (_, _, new_rows, _), (_, _, old_rows, _) = prepared
    memo: dict = {}
    new_bad = _greedy_mismatches(model, new_rows, memo=memo)
    old_bad = _greedy_mismatches(model, old_rows, memo=memo)
    old_bad_body = _greedy_mismatches(model, old_rows, drop_end=True, memo=memo)
    n_new = sum(len(_runs(m)) for _, _, m in new_rows)
    n_old = sum(len(_runs(m)) for _, _, m in old_rows)
    print(f"\ngreedy continuation differs from the trained answer: text path {len(old_bad)} "
          f"of {n_old} answers ({len(old_bad_body)} leaving out a final end token), "
          f"token ids {len(new_bad)} of {n_new}")
    assert new_bad == []


def test_records_without_token_ids_keep_the_text_path(demo_target, generated, tmp_path):
    """Half the records lose their token ids: those are rendered as text, the rest are the
    target's ids; a row count per kind is in the meta. A template setup other than the one
    generated with (allowed) renders everything as text."""
    folder, meta, toks = generated
    part = tmp_path / "ds"
    shutil.copytree(folder, part)
    table = pq.read_table(part / "token_ids.parquet")
    keep = {f"r{i}" for i in range(0, len(TOPICS), 2)}
    mask = [i in keep for i in table.column("id").to_pylist()]
    pq.write_table(table.filter(mask), part / "token_ids.parquet")
    _, m, rows, _ = _prepare(tmp_path / "a", demo_target, part, meta)
    from_ids = [r for r in rows if r[0] in keep]
    assert m["rows_from_token_ids"] == len(from_ids) == sum(k[0] in keep for k in toks)
    assert m["rows_from_text"] == len(TOPICS) - len(keep) == len(rows) - len(from_ids)
    order = [int(r[0][1:]) for r in rows]   # input order, a record's rows together
    assert order == sorted(order) and set(order) == set(range(len(TOPICS)))
    for k, t in toks.items():
        if k[0] in keep:
            assert _turn_reproduced(rows, k[0], t)

    _, m2, rows2, _ = _prepare(tmp_path / "b", demo_target, folder, meta,
                               chat_template_kwargs={"enable_thinking": True},
                               allow_template_mismatch=True)
    assert m2["rows_from_token_ids"] == 0 and m2["rows_from_text"] == len(rows2) == len(TOPICS)


def test_parallel_token_rows_equal_serial(demo_target, generated, prepared, tmp_path):
    """Determinism: two workers over small chunks write the serial run's rows and meta."""
    folder, meta, _ = generated
    (_, m1, rows1, _), _ = prepared
    _, m2, rows2, _ = _prepare(tmp_path, demo_target, folder, meta, num_workers=2,
                               records_per_task=3)
    assert rows2 == rows1
    for k in ("rows_from_token_ids", "rows_from_text", "num_tokens", "num_masked_tokens"):
        assert m2[k] == m1[k]


def test_length_policies_apply_to_token_rows(demo_target, generated, tmp_path):
    folder, meta, toks = generated
    shortest = min(len(t["prompt_ids"]) for t in toks.values())
    cut = shortest + 3
    s, m, rows, out = _prepare(tmp_path / "t", demo_target, folder, meta, seq_length=cut,
                               max_reject_share=1.0)
    assert all(len(ids) <= cut for _, ids, _ in rows) and m["num_truncated"] > 0
    for _, ids, mask in rows:   # the kept part is the target's ids, trained where it was
        assert any(ids == (list(t["prompt_ids"]) + list(t["completion_ids"]))[:cut] and
                   mask == ([0] * len(t["prompt_ids"]) + [1] * len(t["completion_ids"]))[:cut]
                   for t in toks.values())
    # rows cut before their completion are dropped; a record with no row left is rejected
    # by id with the reason
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["reason"] for r in rejects} <= {"too_few_valid_tokens"}
    assert len(rejects) + m["num_records_kept"] == len(TOPICS)
    assert all(r["id"].startswith("r") for r in rejects)

    lens = sorted(len(t["prompt_ids"]) + len(t["completion_ids"]) for t in toks.values())
    cut = lens[len(lens) // 2]
    s2, m2, rows2, out2 = _prepare(tmp_path / "d", demo_target, folder, meta,
                                   seq_length=cut, length_policy="drop", max_reject_share=1.0)
    rejects2 = [json.loads(x) for x in (out2 / "rejects.jsonl").read_text().splitlines()]
    assert all(r["reason"] == "too_long" for r in rejects2) and rejects2
    assert all(len(ids) <= cut for _, ids, _ in rows2)


def test_train_on_last_trains_only_the_last_generated_turn(demo_target, generated, tmp_path):
    folder, meta, toks = generated
    _, m, rows, _ = _prepare(tmp_path, demo_target, folder, meta, train_on="last")
    assert len(rows) == len(TOPICS) == m["rows_from_token_ids"]
    for rid, ids, mask in rows:
        last = max((t for k, t in toks.items() if k[0] == rid), key=lambda t: t["turn"])
        assert ids == list(last["prompt_ids"]) + list(last["completion_ids"])
        assert mask == [0] * len(last["prompt_ids"]) + [1] * len(last["completion_ids"])


def test_a_kept_history_makes_one_row_that_trains_every_turn():
    """A template that keeps the history as generated (turn 2's prompt begins with turn 1's
    prompt + completion): one row, both completions trained with train_on=all, only the last
    with train_on=last; turn ids that do not fit the record are a reject reason."""
    rec = {"id": "x", "messages": [{"role": "user", "content": "a"},
                                   {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"},
                                   {"role": "assistant", "content": "d"}]}
    end = 151645  # <|im_end|>, emitted by the target: part of the completion, trained
    t1 = {"turn": 1, "prompt_ids": [1, 2, 3], "completion_ids": [4, end]}
    t2 = {"turn": 3, "prompt_ids": [1, 2, 3, 4, end, 6, 7], "completion_ids": [8, 9]}
    (row,) = encode_token_turns(rec, [t2, t1], "all")
    assert row.input_ids.tolist() == [1, 2, 3, 4, end, 6, 7, 8, 9]
    assert row.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    (row,) = encode_token_turns(rec, [t1, t2], "last")
    assert row.loss_mask.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    # a re-rendered history (one id differs): each turn in its own context
    t2b = {**t2, "prompt_ids": [1, 2, 3, 4, 0, 6, 7]}
    rows = encode_token_turns(rec, [t1, t2b], "all")
    assert [r.input_ids.tolist() for r in rows] == [[1, 2, 3, 4, end],
                                                   [1, 2, 3, 4, 0, 6, 7, 8, 9]]
    assert [r.loss_mask.tolist() for r in rows] == [[0, 0, 0, 1, 1], [0] * 7 + [1, 1]]
    from workers.stages.prepare.spans import RecordRejected

    with pytest.raises(RecordRejected) as e:
        encode_token_turns(rec, [{**t1, "turn": 2}], "all")
    assert e.value.code == "token_ids_mismatch"
    with pytest.raises(RecordRejected) as e:
        encode_token_turns(rec, [{**t1, "completion_ids": [4, -3]}], "all")
    assert e.value.code == "token_ids_mismatch"
    assert "negative token id (-3)" in e.value.detail
