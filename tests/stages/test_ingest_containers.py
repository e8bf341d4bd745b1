"""Ingest containers: JSON arrays (streamed), gzip, zstd, Parquet; the output read by HF
`datasets`; the stage run as its own process."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.stages.conftest import REPO
from workers.stages.ingest import readers
from workers.stages.ingest.readers import Bad, Source
from workers.stages.records import DATA_FILE, iter_records

from .test_ingest_formats import fixture_lines, run_ingest, write_jsonl


def _strip(recs):
    return [(r["messages"], r.get("tools")) for r in recs]


@pytest.fixture(scope="module")
def sharegpt_objs(datasets_dir):
    return fixture_lines(datasets_dir / "sharegpt.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, datasets_dir):
    """The records the plain JSONL gives: every container must give the same."""
    tmp = tmp_path_factory.mktemp("ref")
    _, meta, recs, _ = run_ingest(tmp, datasets_dir / "sharegpt.jsonl", name="sharegpt")
    return meta, recs


def test_gzip_and_zstd(tmp_path, datasets_dir, reference):
    raw = (datasets_dir / "sharegpt.jsonl").read_bytes()
    gz = tmp_path / "sharegpt.jsonl.gz"
    gz.write_bytes(gzip.compress(raw))
    zst = tmp_path / "sharegpt.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    bz = tmp_path / "sharegpt.jsonl.bz2"
    bz.write_bytes(bz2.compress(raw))
    xz = tmp_path / "sharegpt.jsonl.xz"
    xz.write_bytes(lzma.compress(raw))
    for path, comp in ((gz, "gzip"), (zst, "zstd"), (bz, "bz2"), (xz, "xz")):
        _, meta, recs, _ = run_ingest(tmp_path / comp, path, name="sharegpt")
        assert meta["compression"] == comp and meta["container"] == "jsonl"
        assert recs == reference[1]  # ids, sources and messages identical to the plain file
        assert meta["stats"] == reference[0]["stats"]


def test_zstd_stream_without_content_size(tmp_path, reference, datasets_dir):
    # `zstd` CLI and streaming writers leave the frame size out: must still stream.
    raw = (datasets_dir / "sharegpt.jsonl").read_bytes()
    path = tmp_path / "s.jsonl.zst"
    with open(path, "wb") as fh, zstandard.ZstdCompressor().stream_writer(fh) as w:
        w.write(raw)
    _, _, recs, _ = run_ingest(tmp_path, path, name="sharegpt")
    assert recs == reference[1]


def test_json_array_pretty_printed(tmp_path, sharegpt_objs, reference):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(sharegpt_objs, indent=2, ensure_ascii=False), encoding="utf-8")
    _, meta, recs, _ = run_ingest(tmp_path, path, name="sharegpt")
    assert meta["container"] == "json"
    assert _strip(recs) == _strip(reference[1])
    assert [r["source"] for r in recs] == [f"sharegpt:{i}" for i in range(1, 5)]  # element numbers


def test_json_named_file_holding_json_lines(tmp_path, datasets_dir, reference):
    path = tmp_path / "sharegpt.json"  # what HF `Dataset.to_json` writes
    path.write_bytes((datasets_dir / "sharegpt.jsonl").read_bytes())
    _, meta, recs, _ = run_ingest(tmp_path, path, name="sharegpt")
    assert meta["container"] == "jsonl" and recs == reference[1]


TRICKY = [
    {"prompt": "brackets ] } [ { inside a string, and \"escaped quotes\" \\ and a \\\" too"},
    {"prompt": "unicode: 東京 🙂 \u00e9", "nested": {"a": [1, {"b": "]"}], "c": []}},
    {"prompt": "x" * 5000},
]


@pytest.mark.parametrize("buf", [1, 7, 64, 1 << 20])
def test_json_array_scanner_boundaries(tmp_path, monkeypatch, buf):
    """Element boundaries are found whatever the read size (strings split across reads,
    escapes at a read boundary), and a malformed element is one reject."""
    monkeypatch.setattr(readers, "READ_BUF", buf)
    body = ",\n ".join(json.dumps(o, ensure_ascii=False) for o in TRICKY)
    text = f'\ufeff [ {body}, 42, {{"prompt": "a" "b"}}, "str",\n{{"prompt": "last"}} ]\n'
    path = tmp_path / "tricky.json"
    path.write_text(text, encoding="utf-8")
    with Source(path) as src:
        items = list(src)
    assert [i for i, _ in items] == [1, 2, 3, 4, 5, 6, 7]
    assert [json.loads(b) for _, b in items[:3]] == TRICKY
    assert items[3][1] == b"42" and items[5][1] == b'"str"'
    assert items[6][1] == b'{"prompt": "last"}'
    _, meta, recs, _ = run_ingest(tmp_path, path, name="t")
    assert [r["messages"][0]["content"] for r in recs] == [o["prompt"] for o in TRICKY] + ["last"]
    assert [(x["line"], x["reason"].split(":")[0]) for x in meta["rejected_sample"]] == [
        (4, "not a JSON object (a int)"), (5, "invalid JSON"), (6, "not a JSON object (a str)")]


def test_json_array_truncated_and_not_closed(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[{"prompt": "ok"}, {"prompt": "cut in the mid', encoding="utf-8")
    _, meta, recs, _ = run_ingest(tmp_path, path, max_reject_share=0.9)
    assert len(recs) == 1
    assert meta["rejected_sample"] == [{"line": 2, "reason": "the file ends inside this element "
                                        "(truncated JSON)"}]
    path2 = tmp_path / "open.json"
    path2.write_text('[{"prompt": "ok"}, ', encoding="utf-8")
    with pytest.raises(Exception) as e:
        run_ingest(tmp_path / "b", path2)
    assert getattr(e.value, "code", None) == "ingest_failed" and "not closed" in e.value.message


def test_jsonl_line_over_the_size_limit_is_one_reject(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n' + b'{"prompt": "' + b"x" * 5000 + b'"}\n{"prompt": "b"}')
    with Source(path, max_record_bytes=1000) as src:
        items = list(src)
    assert [i for i, _ in items] == [1, 2, 3]
    assert isinstance(items[1][1], Bad) and "longer than" in items[1][1].reason
    assert items[2][1] == b'{"prompt": "b"}'  # no trailing newline at the end of the file


def test_parquet_input(tmp_path, sharegpt_objs, reference):
    # nested columns as HF hub parquet exports have them (`conversations` list<struct>)
    rows = [{"id": o.get("id"), "conversations": o["conversations"] if isinstance(
        o["conversations"], list) else json.loads(o["conversations"]), "tools": o.get("tools")}
            for o in sharegpt_objs]
    path = tmp_path / "sharegpt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    _, meta, recs, _ = run_ingest(tmp_path, path, name="sharegpt")
    assert meta["container"] == "parquet" and meta["format"] == "sharegpt"
    assert recs == reference[1]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    prog = [e["data"] for e in events if e["kind"] == "progress"]
    assert prog[0] == {"stage": "ingest", "done": 0, "total": 4, "unit": "records"}
    assert prog[-1] == {"stage": "ingest", "done": 4, "total": 4, "unit": "records"}


def test_reingesting_an_output_round_trips(tmp_path, datasets_dir):
    """A dataset artifact's data.parquet is itself an ingestible `messages` file."""
    _, _, first, folder = run_ingest(tmp_path / "a", datasets_dir / "sharegpt.jsonl")
    _, meta, again, _ = run_ingest(tmp_path / "b", folder / DATA_FILE)
    assert meta["format"] == "openai"
    assert _strip(again) == _strip(first)


def test_hf_datasets_loads_the_output(tmp_path, datasets_dir, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    _, meta, recs, folder = run_ingest(tmp_path, datasets_dir / "oasst1_trees.jsonl")
    ds = datasets.load_dataset("parquet", data_files=str(folder / DATA_FILE), split="train",
                               cache_dir=str(tmp_path / "hf_cache"))
    assert ds.num_rows == meta["num_records"] == 3
    assert ds.column_names == ["id", "source", "messages", "tools"]
    assert ds[1]["id"] == recs[1]["id"]
    assert [m["role"] for m in ds[1]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert ds[1]["messages"][3]["content"] == recs[1]["messages"][3]["content"]


def test_stage_runs_as_its_own_process(tmp_path, datasets_dir):
    def cli(src, **params):
        spec = {"inputs": {"source": {"path": str(src), "name": "cli"}}, "params": params,
                "out_dir": str(tmp_path / src.stem / "out"), "work_dir": str(tmp_path / src.stem / "w"),
                "events_path": str(tmp_path / src.stem / "events.jsonl")}
        sp = tmp_path / f"{src.stem}.spec.json"
        sp.write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        p = subprocess.run([sys.executable, "-m", "workers.stages", "ingest", "--spec", str(sp)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        events = [json.loads(x) for x in Path(spec["events_path"]).read_text().splitlines()]
        return p.returncode, events, Path(spec["out_dir"])

    rc, events, out = cli(datasets_dir / "openai_messages.jsonl")
    assert rc == 0
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "progress" and kinds[-2:] == ["artifact", "result"]
    prog = [e["data"] for e in events if e["kind"] == "progress"]
    size = (datasets_dir / "openai_messages.jsonl").stat().st_size
    assert prog[-1] == {"stage": "ingest", "done": size, "total": size, "unit": "bytes"}
    art = next(e["data"] for e in events if e["kind"] == "artifact")
    assert art["name"] == "dataset" and art["kind"] == "dataset" and art["path"] == "dataset"
    assert len(list(iter_records(out / "dataset"))) == art["meta"]["num_records"] == 4

    junk = write_jsonl(tmp_path / "junk.jsonl", [{"foo": i} for i in range(5)])
    rc, events, _ = cli(junk)
    assert rc == 2
    err = events[-1]
    assert err["kind"] == "error" and err["data"]["code"] == "ingest_failed"
    assert "unknown format" in err["data"]["message"]
