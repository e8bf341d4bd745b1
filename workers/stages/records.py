"""The normalized conversation record and the dataset artifact on disk.

A dataset artifact is a folder holding `data.parquet` (readable by HF `datasets`:
`load_dataset("parquet", data_files=...)`) with one row per record:

    id        string   stable record id (source-derived, unique within the dataset)
    source    string   "<dataset name>:<line>" where the record came from
    messages  list<struct<role string, content string, reasoning string?, tool_calls string?,
                          name string?, tool_call_id string?>>
              role in system|user|assistant|tool; tool_calls is a JSON-encoded list of
              {"type": "function", "function": {"name", "arguments": {...}}} or null
    tools     string?  JSON-encoded list of tool schemas, or null

plus `meta.json` written by the producing stage. Readers stream row groups, so memory does
not grow with the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROLES = ("system", "user", "assistant", "tool")

MESSAGE_TYPE = pa.struct([
    ("role", pa.string()),
    ("content", pa.string()),
    ("reasoning", pa.string()),
    ("tool_calls", pa.string()),
    ("name", pa.string()),
    ("tool_call_id", pa.string()),
])
SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("tools", pa.string()),
])
DATA_FILE = "data.parquet"
# Dictionary encoding pays for the role column only: the other strings (ids, sources, contents)
# are nearly all distinct, and the writer hashed every one of them into a dictionary before
# giving up on it page by page (7% of the writer's CPU on the scale bench's OpenOrca).
DICTIONARY_COLUMNS = ["messages.list.element.role"]
# Parquet reads stream pages through a buffer of this size (see `open_parquet`).
READ_BUFFER = 1 << 20
# Beside it in a dataset the generate stage wrote: per generated turn, the prompt ids the
# target was given and the completion ids it returned (generate/shards.py writes it,
# prepare/tokenrows.py builds rows from it).
TOKEN_IDS_FILE = "token_ids.parquet"


def _norm_message(m: dict) -> dict:
    tc = m.get("tool_calls")
    return {
        "role": m["role"],
        "content": m.get("content") if m.get("content") is not None else "",
        "reasoning": m.get("reasoning"),
        "tool_calls": tc if (tc is None or isinstance(tc, str)) else json.dumps(tc, ensure_ascii=False),
        "name": m.get("name"),
        "tool_call_id": m.get("tool_call_id"),
    }


def to_row(rec: dict) -> dict:
    tools = rec.get("tools")
    return {
        "id": str(rec["id"]),
        "source": rec.get("source") or "",
        "messages": [_norm_message(m) for m in rec["messages"]],
        "tools": (tools if (tools is None or isinstance(tools, str))
                  else json.dumps(tools, ensure_ascii=False)),
    }


def from_row(row: dict) -> dict:
    """A row as the chat-template-ready dict: tool_calls/tools decoded, None fields dropped."""
    msgs = []
    for m in row["messages"]:
        out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("reasoning") is not None:
            out["reasoning"] = m["reasoning"]
        if m.get("tool_calls"):
            out["tool_calls"] = json.loads(m["tool_calls"])
        if m.get("name"):
            out["name"] = m["name"]
        if m.get("tool_call_id"):
            out["tool_call_id"] = m["tool_call_id"]
        msgs.append(out)
    rec: dict[str, Any] = {"id": row["id"], "source": row.get("source") or "", "messages": msgs}
    if row.get("tools"):
        rec["tools"] = json.loads(row["tools"])
    return rec


class DatasetWriter:
    """Streams records into `<folder>/data.parquet` in row groups of `batch_rows`."""

    def __init__(self, folder: Path | str, batch_rows: int = 2048, compression: str = "zstd"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.batch_rows = batch_rows
        self._buf: list[dict] = []
        self._writer = pq.ParquetWriter(self.folder / DATA_FILE, SCHEMA, compression=compression,
                                        use_dictionary=DICTIONARY_COLUMNS)
        self.count = 0

    def write(self, rec: dict) -> None:
        self._buf.append(to_row(rec))
        if len(self._buf) >= self.batch_rows:
            self._flush()

    def write_table(self, table: pa.Table) -> None:
        """Append rows already in `SCHEMA` (a stage that builds columns itself, e.g. ingest
        and mix, skips the per-record dict round trip of `write`)."""
        self._flush()
        if not table.schema.equals(SCHEMA):
            table = table.cast(SCHEMA)
        if table.num_rows:
            self._writer.write_table(table)
            self.count += table.num_rows

    def _flush(self) -> None:
        if self._buf:
            self._writer.write_table(pa.Table.from_pylist(self._buf, schema=SCHEMA))
            self.count += len(self._buf)
            self._buf = []

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_parquet(source) -> pq.ParquetFile:
    """A Parquet file to stream with `iter_batches`: with pyarrow's default `pre_buffer=True`
    the reader fetches and keeps the column chunks of every row group it is asked for, so
    iterating a whole file held all of it in memory by the end (RSS grew with the file: 92 MB
    after 168K OpenOrca rows, and mix holds six files at once). Without pre-buffering
    and with a read buffer, memory is about one page per column whatever the file's size (even
    a file written as one huge row group)."""
    return pq.ParquetFile(source, pre_buffer=False, buffer_size=READ_BUFFER)


def iter_batches(folder: Path | str, batch_rows: int = 2048) -> Iterator[pa.RecordBatch]:
    """A dataset folder's rows as Arrow batches, streaming."""
    return open_parquet(Path(folder) / DATA_FILE).iter_batches(batch_size=batch_rows)


def batch_records(batch: pa.RecordBatch | pa.Table) -> list[dict]:
    """Rows as records (`from_row` dicts)."""
    return [from_row(row) for row in batch.to_pylist()]


def iter_records(folder: Path | str, batch_rows: int = 2048) -> Iterator[dict]:
    """Yield records (as `from_row` dicts) from a dataset folder, streaming."""
    for batch in iter_batches(folder, batch_rows):
        yield from batch_records(batch)


def count_records(folder: Path | str) -> int:
    return pq.ParquetFile(Path(folder) / DATA_FILE).metadata.num_rows
