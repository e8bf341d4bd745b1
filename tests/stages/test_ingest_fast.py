"""Ingest's vectorized path (workers/stages/ingest/fast.py) gives exactly what the per-line
path gives: the same data.parquet rows, the same rejects.jsonl, the same meta.json, for the
scale bench's six synthetic sources, every real fixture, and generated files full of the
cases the normalizers treat specially (each file ingested twice, the fast path on and off)."""

from __future__ import annotations

import contextlib
import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench._scale_data import write_sources
from workers.stages.ingest import fast
from workers.stages.ingest.writer import UniqueIds, id_hashes

from .conftest import shared_fixtures
from .test_ingest_formats import run_ingest


@contextlib.contextmanager
def fast_path(on: bool):
    was = fast.ENABLED
    fast.ENABLED = on
    try:
        yield
    finally:
        fast.ENABLED = was


def _ingest(out: Path, src: Path, params: dict) -> dict:
    result, meta, _, folder = run_ingest(out, src, **params)
    table = pq.read_table(folder / "data.parquet")
    return {"result": {k: result[k] for k in ("format", "num_records", "num_rejected")},
            "vectorized": result["vectorized_records"],
            "schema": table.schema, "rows": table.to_pylist(),
            "rejects": (folder / "rejects.jsonl").read_bytes(),
            "meta": json.loads((folder / "meta.json").read_text())}


def both(tmp_path: Path, src: Path, **params) -> tuple[dict, dict]:
    """The outputs of the fast and of the per-line path, after checking they are equal."""
    tag = f"{src.name}-{len(list(tmp_path.iterdir()))}"
    with fast_path(True):
        on = _ingest(tmp_path / f"fast-{tag}", src, params)
    with fast_path(False):
        off = _ingest(tmp_path / f"slow-{tag}", src, params)
    assert off["vectorized"] == 0
    assert on["schema"] == off["schema"]
    assert on["result"] == off["result"]
    assert on["rejects"] == off["rejects"]
    assert on["meta"] == off["meta"]
    assert len(on["rows"]) == len(off["rows"])
    for k, (a, b) in enumerate(zip(on["rows"], off["rows"])):
        assert a == b, f"{src.name}: row {k} differs"
    return on, off


# -- the scale bench's sources ---------------------------------------------------------------
@pytest.fixture(scope="module")
def scale_sources(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("scale")
    return [folder / s.file for s in write_sources(folder, 3000, seed=3, broken_per_source=5)]


@pytest.mark.parametrize("batch_rows", [4096, 97])
def test_scale_sources_give_the_same_dataset(tmp_path, scale_sources, batch_rows):
    vectorized = {}
    for src in scale_sources:
        on, _ = both(tmp_path, src, batch_rows=batch_rows)
        vectorized[src.name] = on["vectorized"] / max(1, on["result"]["num_records"])
    # the flat shapes take the fast path (all but their broken lines); the flat
    # OpenAssistant export is read per line
    assert vectorized.pop("oasst_messages.jsonl") == 0
    assert min(vectorized.values()) > 0.95, vectorized


# -- the real fixtures -------------------------------------------------------------------------
def _fixture_files() -> list[str]:
    try:
        return sorted(p.name for p in (shared_fixtures() / "datasets").iterdir())
    except BaseException:  # noqa: BLE001  no fixtures: the test skips itself
        return ["(none)"]


@pytest.mark.parametrize("fname", _fixture_files())
def test_fixture_files_give_the_same_dataset(tmp_path, datasets_dir, fname):
    src = datasets_dir / fname
    lines = [x for x in src.read_bytes().splitlines() if x.strip()]
    both(tmp_path, src)
    # A fixture holds a few records: each repeated (ids then repeat too), so that runs of one
    # shape are long enough for the fast path, then the whole file repeated.
    big = tmp_path / fname
    big.write_bytes(b"\n".join([x for x in lines for _ in range(12)] + lines * 12) + b"\n")
    on, _ = both(tmp_path, big)
    if fname.split(".")[0] in ("alpaca", "evol_codealpaca", "magicoder_oss_instruct",
                               "openorca", "openai_messages", "sharegpt"):
        assert on["vectorized"] > 0
    both(tmp_path, big, batch_rows=5)


# -- generated edge cases --------------------------------------------------------------------
THINK = "<think>\nweighing it\n</think>\n\nthe answer"
TEXTS = ["plain text", "naïve café 東京 🙂", "", " ", "\n\t ", "\u2028", "\x1c\x1d", "\xa0",
         "\u3000x", "a\u200bb", THINK, "</think>", "x</think>", "\x00nul", "<think>open only"]
VALUES = TEXTS[:2] * 6 + TEXTS + [None, 5, 0, 1.5, True, False, [], ["part one", "two"],
                                  [{"type": "text", "text": "t"}], {}, {"a": 1}]
ODD_IDS = ["", "", 7, 0, -3, 2.0, True, None, [1], "naïve-id"]


def _pick(rng: random.Random, common: str = "plain text", p: float = 0.85):
    return common if rng.random() < p else rng.choice(VALUES)


def _with_id(rng: random.Random, obj: dict) -> dict:
    if rng.random() < 0.5:  # string ids that repeat, now and then another value
        obj["id"] = f"id-{rng.randint(0, 60)}" if rng.random() < 0.9 else rng.choice(ODD_IDS)
    return obj


def _alpaca(rng: random.Random) -> dict:
    obj: dict = {"instruction": _pick(rng, "Name a color.")}
    if rng.random() < 0.7:
        obj["input"] = _pick(rng, rng.choice(["", "blue things"]))
    key = rng.choice(["output", "output", "response"])
    if rng.random() < 0.95:
        obj[key] = _pick(rng, "Red.")
    if rng.random() < 0.1:
        obj["system"] = _pick(rng, "Be brief.", 0.5)
    if rng.random() < 0.05:
        obj["history"] = rng.choice([[], [["q", "a"]], None, ""])
    return _with_id(rng, obj)


def _openorca(rng: random.Random) -> dict:
    obj = {"system_prompt": _pick(rng, rng.choice(["", "You are helpful."])),
           "question": _pick(rng, "What is 2+2?"), "response": _pick(rng, "4")}
    if rng.random() < 0.1:
        obj["answer"] = _pick(rng, "four")
    return _with_id(rng, obj)


def _magicoder(rng: random.Random) -> dict:
    obj = {"lang": "python", "problem": _pick(rng, "Write a loop."),
           "solution": _pick(rng, "for x in y: pass")}
    if rng.random() < 0.6:
        obj["index"] = rng.choice([12, 12, 0, None, "ix", 3.5])
    return _with_id(rng, obj)


def _turn(rng: random.Random, i: int, style: str):
    value = _pick(rng, f"turn {i}", 0.9)
    if style == "lima":
        return value if rng.random() < 0.97 else {"from": "human", "value": "x"}
    speaker = ("human" if i % 2 else "gpt") if rng.random() < 0.9 else rng.choice(
        ["Human", "GPT", "user", "assistant", "system", "function_call", "observation",
         "wizard", None, 3])
    turn = {"from": speaker, "value": value}
    if rng.random() < 0.03:
        turn["reasoning"] = "thought"
    if rng.random() < 0.02:
        del turn["from"]
    return turn


def _sharegpt(rng: random.Random) -> dict:
    style = rng.choice(["lima", "from"])
    turns = [_turn(rng, i, style) for i in range(1, rng.choice([1, 2, 2, 3, 4, 5]) + 1)]
    key = "conversations" if rng.random() < 0.9 else "conversation"
    obj: dict = {key: turns if rng.random() < 0.96 else rng.choice([[], None, "[]", 7])}
    if rng.random() < 0.1:  # both: `conversation` is read where `conversations` is None
        obj["conversations" if key == "conversation" else "conversation"] = rng.choice(
            [None, ["q", "a"]])
    if rng.random() < 0.1:
        obj["system"] = _pick(rng, "sys", 0.5)
    if rng.random() < 0.15:
        obj["tools"] = rng.choice([[], "", None, [{"name": "f", "parameters": {}}]])
    if style == "lima":
        obj["source"] = "stackexchange"
    return _with_id(rng, obj)


def _message(rng: random.Random, i: int) -> dict:
    role = ("user" if i % 2 else "assistant") if rng.random() < 0.9 else rng.choice(
        ["system", "developer", "tool", "function", "wizard", None, ["user"]])
    msg: dict = {"role": role, "content": _pick(rng, f"message {i}", 0.9)}
    if rng.random() < 0.03:
        msg["reasoning_content"] = "thought"
    if rng.random() < 0.02:
        msg["tool_calls"] = [{"function": {"name": "f", "arguments": "{}"}}]
    if rng.random() < 0.02:
        del msg["content"]
    return msg


def _openai(rng: random.Random) -> dict:
    msgs = [_message(rng, i) for i in range(1, rng.choice([1, 2, 2, 3, 4]) + 1)]
    if rng.random() < 0.15:
        msgs.insert(0, {"role": rng.choice(["system", "developer"]),
                        "content": _pick(rng, "Be nice.", 0.7)})
    obj: dict = {"messages": msgs if rng.random() < 0.97 else rng.choice([[], None, "[]"])}
    if rng.random() < 0.15:
        obj["tools"] = rng.choice([[], None, "", [{"name": "f"}]])
    return _with_id(rng, obj)


def _oasst_flat(rng: random.Random, k: int) -> list[dict]:
    tree = f"t{k}"
    rows = [{"message_id": f"{tree}-0", "parent_id": None, "message_tree_id": tree,
             "role": "prompter", "text": "hello", "rank": None}]
    for r in range(rng.choice([1, 2])):
        rows.append({"message_id": f"{tree}-{r + 1}", "parent_id": f"{tree}-0",
                     "message_tree_id": tree, "role": "assistant", "text": f"hi {r}",
                     "rank": r})
    return rows


MAKERS = [_alpaca, _openorca, _magicoder, _sharegpt, _openai]
BROKEN = [b'{"instruction": "cut', b"[1, 2, 3]", b'"a string"', b"not json", b"{}",
          b'{"instruction": "a"} {"instruction": "b"}', b'{"a": NaN}', b"\xff\xfe bytes",
          b'{"question": "dup", "question": "dup2", "response": "r"}', b'{"prompt": "p"}']


def edge_lines(seed: int, n: int = 1500) -> list[bytes]:
    """Runs of one shape (long enough for the fast path) with odd records in them, mixed
    shapes, broken lines, blank lines, OpenAssistant rows between runs."""
    rng = random.Random(seed)
    out: list[bytes] = []
    k = 0
    while len(out) < n:
        make = rng.choice(MAKERS)
        shape = make(rng)  # the run's keys; values drawn afresh for each record
        for _ in range(rng.choice([1, 3, 9, 20, 60])):
            r = rng.random()
            if r < 0.02:
                out.append(rng.choice(BROKEN))
            elif r < 0.03:
                out.append(b"   ")
            elif r < 0.04:
                out.append(json.dumps(rng.choice(MAKERS)(rng)).encode())
            else:
                new = make(rng)
                items = [(key, new.get(key, value)) for key, value in shape.items()]
                if rng.random() < 0.1:
                    rng.shuffle(items)  # the same keys in another order: the same shape
                out.append(json.dumps(dict(items), ensure_ascii=rng.random() < 0.5).encode())
        if rng.random() < 0.1:
            k += 1
            out += [json.dumps(row).encode() for row in _oasst_flat(rng, k)]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_edge_cases_give_the_same_dataset(tmp_path, seed):
    src = tmp_path / f"edge{seed}.jsonl"
    src.write_bytes(b"\n".join(edge_lines(seed)) + b"\n")
    on, off = both(tmp_path, src, max_reject_share=1.0, batch_rows=[4096, 64, 500][seed % 3])
    assert on["vectorized"] > 0.3 * on["result"]["num_records"]
    assert on["result"]["num_rejected"] > 50  # the odd records were there, and rejected


@pytest.mark.parametrize("fmt", ["alpaca", "evol_codealpaca", "openorca", "sharegpt", "openai",
                                 "magicoder"])
def test_forced_format_gives_the_same_dataset(tmp_path, fmt):
    src = tmp_path / "edge.jsonl"
    src.write_bytes(b"\n".join(edge_lines(100 + len(fmt))) + b"\n")
    both(tmp_path, src, format=fmt, max_reject_share=1.0)


def test_containers_give_the_same_dataset(tmp_path):
    lines = edge_lines(7, 600)
    gz = tmp_path / "edge.jsonl.gz"
    gz.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    both(tmp_path, gz, max_reject_share=1.0)
    arr = tmp_path / "edge.json"  # a JSON array: elements, not lines
    good = [x for x in lines if _parses(x)]
    arr.write_bytes(b"[\n" + b",\n".join(good) + b"\n]\n")
    on, _ = both(tmp_path, arr, max_reject_share=1.0)
    assert on["vectorized"] > 0


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def test_parquet_sources_give_the_same_dataset(tmp_path):
    rng = random.Random(11)
    n = 700
    texts = [None, "", " ", "\u2028", THINK, "naïve café", "\x1c\x1d", "\xa0", "\u3000x",
             "a\u200bb", "\x85", "\u180e", "</think>"]

    def col(common: str) -> list:
        return [common if rng.random() < 0.9 else rng.choice(texts) for _ in range(n)]

    tables = {
        "orca.parquet": pa.table({"id": [f"o{rng.randint(0, 600)}" for _ in range(n)],
                                  "system_prompt": col(""), "question": col("q?"),
                                  "response": col("r."), "answer": col("a.")}),
        "orca_int_ids.parquet": pa.table({"id": pa.array([rng.randint(0, 50) for _ in range(n)]),
                                          "question": col("q?"), "response": col("r.")}),
        "alpaca_large.parquet": pa.table({"instruction": pa.array(col("do"), pa.large_string()),
                                          "input": col(""), "output": col("done")}),
        "magicoder.parquet": pa.table({"problem": col("p"), "solution": col("s"),
                                       "index": pa.array(list(range(n)))}),
        "magicoder_ids.parquet": pa.table({"problem": col("p"), "solution": col("s"),
                                           "id": col("m1"), "index": pa.array(list(range(n)))}),
        "orca_dictionary.parquet": pa.table({"question": pa.array(col("q")).dictionary_encode(),
                                             "response": col("r")}),
        "orca_binary.parquet": pa.table({"question": pa.array([b"q"] * n, pa.binary()),
                                         "response": col("r")}),
        "alpaca_history.parquet": pa.table({"instruction": col("i"), "input": col("in"),
                                            "output": col("o"), "system": col("sys"),
                                            "history": [[] if rng.random() < 0.9 else [["a", "b"]]
                                                        for _ in range(n)]}),
        "lima.parquet": pa.table({"conversations": [
            [rng.choice(["q", "", "a", THINK]) for _ in range(rng.randint(0, 4))]
            for _ in range(n)]}),
        "sharegpt.parquet": pa.table({"conversations": [
            [{"from": rng.choice(["human", "gpt", "system", "tool"]),
              "value": rng.choice(["x", " ", "y"])} for _ in range(rng.randint(1, 4))]
            for _ in range(n)]}),
    }
    for fname, table in tables.items():
        src = tmp_path / fname
        pq.write_table(table, src, row_group_size=rng.choice([50, 300]))
        on, _ = both(tmp_path, src, max_reject_share=1.0, batch_rows=128)
        if fname != "orca_binary.parquet":
            assert on["vectorized"] > 0, fname
        # the single-turn shapes of text columns take the Arrow-compute path
        batch = pq.ParquetFile(src).read_row_group(0).to_batches()[0]
        mapper = fast.MAPPERS.get({"orca": "openorca", "alpaca": "alpaca",
                                   "magicoder": "magicoder"}.get(fname.split("_")[0].split(".")[0], ""))
        if mapper is not None:
            arrow = isinstance(mapper(fast.BatchRows(batch)), fast.ArrowBuilt)
            assert arrow == (fname != "orca_binary.parquet"), fname


def test_arrow_utf8_is_space_is_str_isspace_over_every_code_point():
    """The Arrow path's blank test (fast._present) is Python's, on every code point alone,
    doubled, and behind a letter."""
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    for texts in (chars, [c + c for c in chars], ["x" + c for c in chars]):
        assert pc.utf8_is_space(pa.array(texts)).to_pylist() == [t.isspace() for t in texts]


# -- the pieces --------------------------------------------------------------------------------
def _hash_one(rid: str) -> int:
    """writer.id_hashes for one string, in Python integers: the reference."""
    m = (1 << 64) - 1
    b = rid.encode()
    h = sum(x * pow(0x100000001B3, j, 1 << 64) for j, x in enumerate(b)) & m
    h = (h + len(b) * 0x9E3779B97F4A7C15) & m
    for k in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, None):
        h ^= h >> 33
        if k is not None:
            h = (h * k) & m
    return h


class _OneByOne:
    """The Bloom filter of UniqueIds, one id at a time, in Python: the reference."""

    def __init__(self, bits: int):
        self.bits, self.mask, self.renamed = bytearray(bits >> 3), bits - 1, 0

    def __call__(self, rid: str, line: int) -> str:
        h = _hash_one(rid)
        p, q = h & self.mask, (h >> 32) & self.mask
        if self.bits[p >> 3] & (1 << (p & 7)) and self.bits[q >> 3] & (1 << (q & 7)):
            self.renamed += 1
            return f"{rid}#{line}"
        self.bits[p >> 3] |= 1 << (p & 7)
        self.bits[q >> 3] |= 1 << (q & 7)
        return rid


def test_id_hashes_match_the_reference_on_sliced_arrays():
    ids = ["", "a", "a\x00", "é", "東京", "x" * 300, "id-1", "id-2", "1-di"]
    arr = pa.array(["pad", *ids, "pad"], pa.string()).slice(1, len(ids))
    got = id_hashes(arr).tolist()
    assert got == [_hash_one(r) for r in ids]
    assert len(set(got)) == len(ids)


def test_vectorized_unique_ids_match_one_by_one():
    rng = random.Random(2)
    for bits in (1 << 10, 1 << 14, 1 << 27):  # small filters: many false positives too
        one, many = _OneByOne(bits), UniqueIds(bits)
        line = 0
        for _ in range(30):
            ids = [None if rng.random() < 0.2 else rng.choice(
                [f"id{rng.randint(0, 300)}", "é", "x" * rng.randint(1, 40)])
                for _ in range(rng.randint(0, 200))]
            lines = list(range(line + 1, line + len(ids) + 1))
            line += len(ids)
            want = [None if r is None else one(r, ln) for r, ln in zip(ids, lines)]
            got = many.many(pa.array(ids, pa.string()), pa.array(lines, pa.int64()))
            assert got.to_pylist() == want
            assert (one.renamed, one.bits) == (many.renamed, many._bits)
