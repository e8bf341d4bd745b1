"""Ingest: bad records are rejected one by one with their line and reason; whole-file
failures are typed errors; parameters are checked; statistics are right."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from workers.stages.common import StageError
from workers.stages.ingest.stats import DatasetStats
from tests.stages.records_support import write_dataset

from .test_ingest_formats import run_ingest, write_jsonl

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
# a binary blob with no newline byte in it, so it is one "line"
BLOB = b"\x89PNG\r\x1a\x00\x00\x00\rIHDR" + bytes(x for x in range(256) if x != 10) * 4

# (line bytes, expected reason prefix or None for a good record)
LINES = [
    (json.dumps(GOOD).encode(), None),
    (b'{"messages": [{"role": "user", "content": "hi"}', "invalid JSON: "),
    (json.dumps({"instruction": "Name a color.", "input": "", "output": "Red."}).encode(), None),
    (json.dumps({"messages": [{"role": "user", "content": ""}]}).encode(),
     "empty content in message 1 (user)"),
    (json.dumps({"foo": 1, "bar": [2]}).encode(), "unknown record shape (keys: foo, bar)"),
    (BLOB, f"binary data ({len(BLOB)} bytes), not a JSON record"),
    ('{"prompt": "café"}'.encode("latin-1"), "non-UTF-8 bytes at byte 15 (0xe9)"),
    (b"[1, 2, 3]", "not a JSON object (a list)"),
    (b"   ", None),  # blank: skipped, neither record nor reject
    (json.dumps({"conversations": [{"from": "human", "value": "Q"},
                                   {"from": "gpt", "value": "A"}]}).encode(), None),
    (json.dumps({"messages": "not json["}).encode(), "messages is a string but not valid JSON"),
    (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
     "message 1: unknown role 'wizard'"),
    (json.dumps({"conversations": [{"from": "human", "value": "  \n "}]}).encode(),
     "empty content in turn 1 (user)"),
    (json.dumps({"instruction": "x", "output": 5}).encode(), "output: content is int, not text"),
    (json.dumps({"messages": [{"role": "system", "content": "only a system prompt"}]}).encode(),
     "only system messages"),
    (json.dumps({"messages": [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": "<think>r</think>   "}]}).encode(),
     None),  # reasoning only: kept (the answer is empty but the turn is not)
    (json.dumps({"messages": [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": " "}]}).encode(),
     "empty content in message 2 (assistant)"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
     "message 1: non-text content part (image_url)"),
] + [(json.dumps({"prompt": f"good prompt {i}"}).encode(), None) for i in range(12)]


@pytest.fixture()
def bad_file(tmp_path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(line for line, _ in LINES) + b"\n")
    return path


def test_bad_records_are_rejected_with_line_and_reason(tmp_path, bad_file):
    result, meta, recs, folder = run_ingest(tmp_path, bad_file)
    want_bad = [(i, why) for i, (_, why) in enumerate(LINES, 1) if why is not None]
    want_good = [i for i, (line, why) in enumerate(LINES, 1) if why is None and line.strip()]
    assert meta["num_rejected"] == result["num_rejected"] == len(want_bad) == 13
    assert meta["num_records"] == len(recs) == len(want_good) == 16
    assert [r["source"] for r in recs] == [f"bad:{i}" for i in want_good]
    rejects = [json.loads(x) for x in (folder / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [i for i, _ in want_bad]
    for got, (line, why) in zip(rejects, want_bad):
        assert got["reason"].startswith(why), (line, got["reason"])
    assert meta["rejected_sample"] == rejects  # fewer than 20: the sample is all of them
    assert meta["num_lines"] == 29  # the blank line is not an input record
    think = next(r for r in recs if r["source"] == "bad:16")
    # split as the Qwen3 templates do: only newlines are stripped after </think>
    assert think["messages"][1] == {"role": "assistant", "content": "   ", "reasoning": "r"}


def test_reject_sample_is_the_first_twenty(tmp_path):
    objs = [{"prompt": ""} if i % 2 else {"prompt": f"p{i}"} for i in range(60)]
    _, meta, recs, folder = run_ingest(tmp_path, write_jsonl(tmp_path / "half.jsonl", objs))
    assert meta["num_rejected"] == 30 and len(recs) == 30  # 50% is not above 0.5
    assert [r["line"] for r in meta["rejected_sample"]] == list(range(2, 41, 2))
    assert len((folder / "rejects.jsonl").read_text().splitlines()) == 30


def test_too_many_rejects_fails_with_a_summary(tmp_path, bad_file):
    with pytest.raises(StageError) as e:
        run_ingest(tmp_path, bad_file, max_reject_share=0.25)
    err = e.value
    assert err.code == "too_many_rejects"
    assert err.message.startswith("13 of 29 records rejected (45% > max_reject_share 25%)")
    assert "empty content in message N" in err.message
    assert err.details["num_rejected"] == 13 and len(err.details["rejected_sample"]) == 13


def test_whole_file_failures_are_typed(tmp_path):
    def fails(path, **params):
        with pytest.raises(StageError) as e:
            run_ingest(tmp_path / f"run_{path.name}", path, **params)
        return e.value

    e = fails(tmp_path / "missing.jsonl")
    assert e.code == "ingest_failed" and "cannot read" in e.message
    e = fails(write_jsonl(tmp_path / "foreign.jsonl", [{"col_a": 1, "col_b": "x"}] * 10))
    assert e.code == "ingest_failed"
    assert "unknown format: none of the first 10 records has a known shape (keys: col_a, col_b)" \
        in e.message
    flat = write_jsonl(tmp_path / "flat.jsonl", [{"message_id": "m", "parent_id": None,
                                                 "text": "x"}])
    assert "flat OpenAssistant message export" in fails(flat).message
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 64)
    e = fails(blob)
    assert e.code == "ingest_failed" and "no JSON object" in e.message
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    assert "holds no records" in fails(empty, format="openai").message
    # a gzip stream that breaks after a few MB: the records so far do not save the file
    rnd = random.Random(0)
    body = b"".join(b'{"prompt": "%s"}\n' % rnd.randbytes(20).hex().encode() for _ in range(60000))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(body)[:-1000])
    e = fails(cut)
    assert e.code == "ingest_failed" and "unreadable after" in e.message
    assert "end-of-stream marker" in e.message


@pytest.mark.parametrize("params, field", [
    ({"format": "xml"}, "params.format"),
    ({"max_reject_share": 1.5}, "params.max_reject_share"),
    ({"unknown": 1}, "params.unknown"),
    ({"batch_rows": 0}, "params.batch_rows"),
])
def test_invalid_params_name_the_field(tmp_path, params, field):
    src = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}])
    with pytest.raises(StageError) as e:
        run_ingest(tmp_path, src, **params)
    assert e.value.code == "invalid_params" and e.value.message.startswith(field)
    assert e.value.details["errors"][0]["field"] == field


def test_small_batches_give_the_same_dataset(tmp_path, bad_file):
    _, meta1, recs1, _ = run_ingest(tmp_path / "a", bad_file)
    _, meta2, recs2, _ = run_ingest(tmp_path / "b", bad_file, batch_rows=3)
    assert recs1 == recs2 and meta1["stats"] == meta2["stats"]


def test_length_percentiles_exact_below_4096_and_close_above(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 4000, size=500).tolist() + rng.integers(4096, 200_000, size=300).tolist()
    recs = [{"id": str(i), "messages": [{"role": "user", "content": "x" * n}]}
            for i, n in enumerate(lengths)]
    write_dataset(tmp_path / "ds", recs)
    st = DatasetStats()
    import pyarrow.parquet as pq
    for b in pq.ParquetFile(tmp_path / "ds" / "data.parquet").iter_batches(batch_size=64):
        st.update(b)
    res = st.result()["length_percentiles"]
    small = DatasetStats()
    small_recs = recs[:500]
    write_dataset(tmp_path / "small", small_recs)
    small.update(pq.read_table(tmp_path / "small" / "data.parquet"))
    for q in (50, 90, 99):
        exact = int(np.percentile(lengths, q, method="inverted_cdf"))
        assert exact * 0.996 <= res[f"p{q}"] <= exact
        assert small.percentile(q) == int(np.percentile(lengths[:500], q, method="inverted_cdf"))
    assert res["max"] == max(lengths)
