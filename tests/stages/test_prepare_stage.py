"""The prepare stage end to end: real dataset artifacts, tiny real targets (Qwen3 and the
Qwen3.5 hybrid with the Qwen3.6 template), output read back with speculators' own code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.stages.prepare_support import A, S, T, U, m, tool_call, write_small_target
from tests.stages.conftest import target_input

from workers.stages.common import StageContext, StageError
from workers.stages.prepare import template_sha256, tokenize_record
from tests.stages.typed import run_stage
from workers.stages.prepare.masks import load_tokenizer
from workers.stages.prepare.spans import RecordRejected
from tests.stages.records_support import write_dataset


@pytest.fixture(scope="module")
def small_target(tmp_path_factory, templates_dir) -> dict:
    """A small real tokenizer with the Qwen3 template, for the tests that run the stage often."""
    text = (templates_dir / "qwen3.jinja").read_text()
    return target_input(write_small_target(tmp_path_factory.mktemp("small_target"), text))


def records() -> list[dict]:
    """Varied good records plus the shapes that must be rejected, in a fixed order."""
    good = []
    for i in range(30):
        msgs = []
        if i % 3 == 0:
            msgs.append(m(S, f"System prompt {i} ✓"))
        for t in range(1 + i % 3):
            msgs.append(m(U, f"Question {i}.{t}: what is {i} + {t}? 東京"))
            if i % 5 == 0 and t == 0:
                msgs.append(m(A, "", tool_calls=[tool_call("add", a=i, b=t)]))
                msgs.append(m(T, str(i + t), name="add"))
            a = m(A, f"The answer is {i + t} — café {'🙂' * (i % 4)}")
            if i % 2:
                a["reasoning"] = f"Add {i} and {t}."
            msgs.append(a)
        good.append({"id": f"g{i}", "source": f"test:{i}", "messages": msgs})
    bad = [
        {"id": "prompt_only", "source": "test:p", "messages": [m(U, "needs an answer")]},
        {"id": "no_user", "source": "test:n", "messages": [m(S, "s"), m(A, "orphan")]},
        {"id": "late_sys", "source": "test:l", "messages": [m(U, "q"), m(S, "x"), m(A, "a")]},
    ]
    # interleave so that order preservation is visible
    return good[:10] + bad[:1] + good[10:20] + bad[1:] + good[20:]


def spec_for(tmp: Path, target: dict, recs: list[dict], meta: dict | None = None, **params):
    ds = tmp / "ds"
    if not ds.exists():
        write_dataset(ds, recs)
    return {"inputs": {"dataset": {"path": str(ds), "meta": meta or {}}, "target": target},
            "params": params, "out_dir": str(tmp / "out"), "work_dir": str(tmp / "work"),
            "events_path": str(tmp / "events.jsonl")}


def run_spec(spec):
    ctx = StageContext.from_spec(spec)
    try:
        return run_stage("prepare", spec, ctx), ctx
    finally:
        ctx.close()


def test_end_to_end_on_the_hybrid_target(tmp_path, tiny_target_q35, templates_dir):
    from datasets import load_from_disk

    recs = records()
    target = target_input(tiny_target_q35)
    spec = spec_for(tmp_path, target, recs, seq_length=4096, num_workers=2, records_per_task=7,
                    draft_vocab_size=16)
    summary, ctx = run_spec(spec)

    assert summary["num_rows"] == 30 and summary["num_rejected"] == 3
    assert summary["rejected_by_reason"] == {"needs_generate": 1, "template_error": 2}
    art = ctx.artifacts[0]
    assert art["name"] == "tokenized" and art["kind"] == "tokenized"
    meta = art["meta"]
    folder = Path(spec["out_dir"]) / art["path"]
    tmpl_text = (templates_dir / "qwen3_6.jinja").read_text()
    assert meta["chat_template_sha256"] == template_sha256(tmpl_text)
    assert meta["template_errors"] == {"No user query found in messages.": 1,
                                       "System message must be at the beginning.": 1}
    assert meta["self_check_failures"] == 0 and meta["mask_method"] == "anchors"
    assert meta["generation_header"] == "<|im_start|>assistant\n<think>\n"
    assert "<|im_end|>" in meta["end_tokens"]

    rejects = [json.loads(x) for x in (folder / "rejects.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reason"], r["message"]) for r in rejects] == [
        ("prompt_only", "needs_generate", "no assistant answer in the record"),
        ("no_user", "template_error", "No user query found in messages."),
        ("late_sys", "template_error", "System message must be at the beginning."),
    ]

    ds = load_from_disk(str(folder))
    assert ds.column_names == ["input_ids", "loss_mask", "seq_len", "id"]
    assert ds["id"] == [r["id"] for r in recs if r["id"].startswith("g")]   # input order
    tok = load_tokenizer(target["tokenizer_path"])
    rows = ds.with_format(None)
    total = masked = 0
    for row, r in zip(rows, [r for r in recs if r["id"].startswith("g")]):
        ids, mask = tokenize_record(r, tok, tmpl_text)        # the planner's pure function
        assert row["input_ids"] == ids and row["loss_mask"] == mask
        assert row["seq_len"] == len(ids) and 0 < sum(mask) < len(mask)
        total += len(ids)
        masked += sum(mask)
    assert meta["num_tokens"] == total and meta["num_masked_tokens"] == masked

    # token frequencies: exactly speculators' own count over the same rows
    import torch
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution, save_token_frequency_distribution,
    )
    ours = torch.load(folder / "token_freq.pt", weights_only=True)
    save_token_frequency_distribution(ds, tmp_path / "theirs.pt")
    assert ours == torch.load(tmp_path / "theirs.pt", weights_only=True)
    assert sum(ours.values()) == masked

    # draft vocabulary files under the names `speculators train --draft-vocab-size 16` loads
    d2t, t2d = np.load(folder / "d2t-16.npy"), np.load(folder / "t2d-16.npy")
    e_d2t, e_t2d = build_vocab_mappings_from_distribution(ours, 16, target["config"]["vocab_size"])
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_
    assert (d2t == e_d2t.numpy()).all() and (t2d == e_t2d.numpy()).all()
    top = sorted(ours, key=lambda t: (-ours[t], t))[:16]
    assert sorted(top) == sorted((np.arange(16) + d2t).tolist())

    # speculators' training dataset reads the rows, given hidden states for them
    from safetensors.torch import save_file
    from speculators.train.data import ArrowDataset

    hs_dir = folder / "hidden_states"
    hs_dir.mkdir()
    for i in range(3):
        n = ds[i]["seq_len"].item()
        save_file({"hidden_states": torch.zeros(n, 4, 8), "token_ids": ds[i]["input_ids"]},
                  str(hs_dir / f"hs_{i}.safetensors"))
    ad = ArrowDataset(max_len=4096, datapath=str(folder), on_missing="raise")
    assert len(ad) == 30 and ad.approx_lengths == rows["seq_len"]
    for i in range(3):
        item = ad[i]
        assert item["input_ids"].dtype == torch.long and item["loss_mask"].dtype == torch.long
        assert item["input_ids"].tolist() == rows[i]["input_ids"]
        assert item["loss_mask"].tolist() == rows[i]["loss_mask"]
        assert item["hidden_states"].shape == (rows[i]["seq_len"], 3 * 8)

    events = [json.loads(x) for x in Path(spec["events_path"]).read_text().splitlines()]
    progress = [e["data"] for e in events if e["kind"] == "progress"]
    assert progress[-1] == {"stage": "prepare", "done": 33, "total": 33, "unit": "records"}


def test_parallel_output_identical_to_serial(tmp_path, small_target):
    from datasets import load_from_disk

    recs = records()
    target = small_target
    outs = []
    for w in (1, 2):
        spec = spec_for(tmp_path / f"w{w}", target, recs, num_workers=w, records_per_task=4,
                        train_on="last")
        summary, ctx = run_spec(spec)
        folder = Path(spec["out_dir"]) / ctx.artifacts[0]["path"]
        outs.append((load_from_disk(str(folder)).with_format(None).to_dict(),
                     (folder / "token_freq.pt").read_bytes(), summary))
    assert outs[0][0] == outs[1][0] and outs[0][2] == outs[1][2]
    # the Qwen3 template accepts the odd shapes but the prompt-only one
    assert outs[0][2]["rejected_by_reason"] == {"needs_generate": 1}
    # train_on=last: one masked run per row
    for mask in outs[0][0]["loss_mask"]:
        starts = sum(1 for a, b in zip([0] + mask, mask) if b and not a)
        assert starts == 1


def test_length_policy_counted(tmp_path, small_target):
    recs = records()
    target = small_target
    full, ctx = run_spec(spec_for(tmp_path / "f", target, recs, num_workers=1))
    p50 = int(ctx.artifacts[0]["meta"]["length_percentiles"]["p50"])
    summary, ctx = run_spec(spec_for(tmp_path / "t", target, recs, seq_length=p50,
                                     num_workers=1, max_reject_share=1.0))
    meta = ctx.artifacts[0]["meta"]
    assert summary["num_truncated"] > 0 and meta["length_percentiles"]["max"] == p50
    # truncated rows whose trained tokens were all cut are rejected and counted
    assert summary["num_rows"] + summary["num_rejected"] == len(recs)
    assert summary["num_rows"] + summary["rejected_by_reason"].get("too_few_valid_tokens", 0) \
        == full["num_rows"]
    summary, _ = run_spec(spec_for(tmp_path / "d", target, recs, seq_length=p50,
                                   length_policy="drop", num_workers=1, max_reject_share=1.0))
    assert summary["num_truncated"] == 0
    assert summary["num_rows"] + summary["rejected_by_reason"]["too_long"] == full["num_rows"]


def test_template_mismatch_refused_unless_allowed(tmp_path, small_target):
    recs = records()[:5]
    target = small_target
    gen_meta = {"generation": {"chat_template_sha256": "0" * 64,
                               "chat_template_kwargs": {"enable_thinking": False}}}
    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "a", target, recs, meta=gen_meta))
    assert e.value.code == "template_mismatch"
    assert "enable_thinking" in e.value.message
    summary, _ = run_spec(spec_for(tmp_path / "b", target, recs, meta=gen_meta,
                                   allow_template_mismatch=True, num_workers=1))
    assert summary["num_rows"] == 5
    events = (tmp_path / "b" / "events.jsonl").read_text()
    assert "generated with another template setup" in events
    # the same setup as at generation passes silently
    tok = load_tokenizer(target["tokenizer_path"])
    same = {"generation": {"chat_template_sha256": template_sha256(tok.chat_template),
                           "chat_template_kwargs": {}}}
    summary, _ = run_spec(spec_for(tmp_path / "c", target, recs, meta=same, num_workers=1))
    assert summary["num_rows"] == 5


def test_job_level_failures(tmp_path, small_target, templates_dir):
    target = small_target
    broken = (templates_dir / "vicuna_vllm_BROKEN_apostrophe.jinja").read_text()
    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "a", target, records()[:3], chat_template=broken))
    assert (e.value.code, e.value.message) == (
        "template_error", "expected token 'end of statement block', got 's' (line 5)")

    prompts = [{"id": f"p{i}", "source": "", "messages": [m(U, "q")]} for i in range(4)]
    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "b", target, prompts + records()[:2], num_workers=1))
    assert e.value.code == "too_many_rejects"
    d = e.value.details
    assert d["rejected_by_reason"] == {"needs_generate": 4}
    # The rejected records by id with their message, and the full list in the job folder.
    assert [(f["id"], f["reason"], f["message"]) for f in d["failed_sample"]] == [
        (f"p{i}", "needs_generate", "no assistant answer in the record") for i in range(4)]
    assert "p0 (needs_generate)" in e.value.message
    assert len(Path(d["failures_file"]).read_text().splitlines()) == 4
    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "e", target, prompts, num_workers=1, max_reject_share=1.0))
    assert e.value.code == "empty_output" and "needs_generate" in e.value.message

    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "c", target, records()[:2], train_on="first"))
    assert e.value.code == "invalid_params" and "params.train_on" in e.value.message
    with pytest.raises(StageError) as e:
        run_spec(spec_for(tmp_path / "d", target, records()[:2], seq_lenght=10))
    assert e.value.code == "invalid_params" and "seq_lenght" in e.value.message


def test_tokenize_record_rejects_with_reason(small_target):
    tok = load_tokenizer(small_target["tokenizer_path"])
    with pytest.raises(RecordRejected) as e:
        tokenize_record({"id": "x", "messages": [m(U, "q")]}, tok)
    assert e.value.code == "needs_generate"


@pytest.mark.slow
def test_runs_alone_from_the_command_line(tmp_path, tiny_target):
    """`python -m workers.stages prepare --spec spec.json`: exit 0, events, the artifact;
    a broken template: exit 2 with a typed error event."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    spec = spec_for(tmp_path / "ok", target_input(tiny_target), records()[:6])
    (tmp_path / "ok.json").write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-m", "workers.stages", "prepare", "--spec",
                        str(tmp_path / "ok.json")], cwd=repo, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    kinds = [json.loads(x)["kind"] for x in Path(spec["events_path"]).read_text().splitlines()]
    assert "artifact" in kinds and kinds[-1] == "result"
    from datasets import load_from_disk
    assert len(load_from_disk(str(Path(spec["out_dir"]) / "tokenized"))) == 6

    bad = spec_for(tmp_path / "bad", target_input(tiny_target), records()[:2],
                   chat_template="{% if %}")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    p = subprocess.run([sys.executable, "-m", "workers.stages", "prepare", "--spec",
                        str(tmp_path / "bad.json")], cwd=repo, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 2
    err = json.loads(Path(bad["events_path"]).read_text().splitlines()[-1])
    assert err["kind"] == "error" and err["data"]["code"] == "template_error"
    assert "(line 1)" in err["data"]["message"]


def test_max_samples_takes_the_first_records_over_row_groups(tmp_path, small_target):
    """Tasks are slices of the Arrow batches the parent reads (row groups of 8 here, 3 rows a
    task): the first max_samples records, in order, whatever the boundaries."""
    from datasets import load_from_disk

    from workers.stages.records import DatasetWriter

    recs = records()
    ds = tmp_path / "ds"
    with DatasetWriter(ds, batch_rows=8) as w:
        for r in recs:
            w.write(r)
    spec = spec_for(tmp_path, small_target, recs, num_workers=2, records_per_task=3,
                    max_samples=21)
    summary, ctx = run_spec(spec)
    rows = load_from_disk(str(Path(spec["out_dir"]) / ctx.artifacts[0]["path"])).with_format(None)
    assert rows["id"] == [r["id"] for r in recs[:21] if r["id"] != "prompt_only"]
    assert summary["rejected_by_reason"] == {"needs_generate": 1}


def test_a_pool_worker_dies_on_sigterm_whichever_thread_takes_it():
    """The stage turns SIGTERM into an exception in its main thread; a pool worker must not,
    or a signal the kernel hands to another of its threads leaves it blocked on its task
    queue forever (the pool's terminate() then waits on it: an 800K prepare hung so)."""
    import multiprocessing as mp
    import os
    import signal
    import threading
    import time

    from workers.stages.__main__ import _sigterm
    from workers.stages.prepare.pool import MaskerConfig, adopt_masker, init_pool_worker

    cfg = MaskerConfig("tok", "tmpl", {}, "all", "2026-01-01T00:00:00", [], "auto", None,
                       "truncate", 1)
    adopt_masker(cfg, None)  # type: ignore[arg-type]  # the worker finds it built: no tokenizer
    ctx = mp.get_context("fork")
    ready = ctx.Event()

    def worker():
        signal.signal(signal.SIGTERM, _sigterm)  # what it inherits from the stage
        init_pool_worker(cfg)
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # only that thread can
        ready.set()
        time.sleep(30)

    p = ctx.Process(target=worker)
    p.start()
    try:
        assert ready.wait(10)
        os.kill(p.pid, signal.SIGTERM)
        p.join(10)
        assert p.exitcode == -signal.SIGTERM
    finally:
        if p.is_alive():
            p.kill()
            p.join()
