"""Streaming readers: one source file -> `(line, item)` pairs in constant memory.

`item` is the raw bytes of one JSON value (JSON Lines, JSON arrays; parsed by the caller with
orjson, so a bad value is a per-record reject), a dict (Parquet rows, already decoded), or a
`Bad` reason (a line over the size limit). `line` is the 1-based physical line for JSON Lines
(blank lines are skipped but counted) and the 1-based element or row number for JSON arrays
and Parquet.

The container is sniffed from the bytes, not the name: gzip, zstd, bz2 and xz streams are
decompressed on the fly, Parquet is read by row batches, and a text stream whose first
non-blank byte is `[` is a JSON array (anything else is JSON Lines, which is also what
`Dataset.to_json` writes under a `.json` name).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One record larger than this is rejected (JSONL) or fails the file (JSON array) instead of
# being read whole: a binary blob with no newline must not take the worker's memory.
MAX_RECORD_BYTES = 64 << 20
STREAM_BUF = 1 << 20  # buffer of the (decompressed) stream; also what the format sniff sees
READ_BUF = 1 << 20    # read size of the JSON array scanner


class ReaderError(Exception):
    """The file as a whole cannot be read (missing, corrupt stream, not a JSON array...)."""

    code = "ingest_failed"


class InflatesTooMuch(ReaderError):
    code = "decompressed_too_large"


class _Capped(io.RawIOBase):
    """A decompressing stream that stops past `cap` inflated bytes: a file in the data roots
    is held to the cap uploads are (DRAFTYARD_MAX_DECOMPRESSED_BYTES)."""

    def __init__(self, inner, cap: int, what: str):
        self.inner, self.cap, self.what, self.seen = inner, cap, what, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.inner.read(len(b))
        self.seen += len(data)
        if self.seen > self.cap:
            raise InflatesTooMuch(f"{self.what} inflates past DRAFTYARD_MAX_DECOMPRESSED_BYTES "
                                  f"({self.cap} bytes); nothing was ingested")
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.inner.close()
        super().close()


@dataclass(frozen=True)
class Bad:
    reason: str


class Source:
    """An opened source file. Iterate for `(line, item)`; `done()`/`total` give progress in
    `unit` (compressed bytes consumed, or Parquet rows)."""

    def __init__(self, path: str | Path, max_record_bytes: int = MAX_RECORD_BYTES,
                 max_inflated_bytes: int | None = None):
        self.path = Path(path)
        self.max_record_bytes = max_record_bytes
        self.max_inflated_bytes = max_inflated_bytes
        try:
            self.total = self.path.stat().st_size
            self._raw = open(self.path, "rb")  # noqa: SIM115  closed in close()
            magic = self._raw.read(6)
            self._raw.seek(0)
        except OSError as e:
            raise ReaderError(f"cannot read {self.path}: {e.strerror or e}") from e
        try:
            self._sniff(magic)
        except BaseException:
            self._raw.close()
            raise

    def _sniff(self, magic: bytes) -> None:
        if not self.path.is_file():
            raise ReaderError(f"{self.path} is not a file")
        self.unit = "bytes"
        self._rows_done = 0
        self.compression: str | None = None
        if magic[:4] == b"PAR1":
            self.container = "parquet"
            self._parquet = self._open_parquet()
            self.total, self.unit = self._parquet.metadata.num_rows, "records"
            return
        self.compression, stream = _decompressor(magic, self._raw)
        if self.compression and self.max_inflated_bytes is not None:
            stream = io.BufferedReader(_Capped(stream, self.max_inflated_bytes, self.path.name),
                                       STREAM_BUF)
        self._stream: Any = stream
        first = self._peek_first_byte()
        self.container = "json" if first == b"[" else "jsonl"

    def _peek_first_byte(self) -> bytes:
        try:
            head = self._stream.peek(4096)
        except (OSError, EOFError, ValueError) as e:
            raise ReaderError(f"cannot decompress {self.path} ({self.compression}): {e}") from e
        head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
        return head[:1]

    def done(self) -> int:
        if self.container == "parquet":
            return self._rows_done
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if self.container == "parquet":
            return self._guarded(self._parquet_rows())
        if self.container == "json":
            return self._guarded(_json_array(self._stream, self.max_record_bytes))
        return self._guarded(_json_lines(self._stream, self.max_record_bytes))

    def parquet_batches(self, rows: int) -> Iterator[tuple[int, Any]]:
        """Parquet only: `(line of its first row, pyarrow.RecordBatch)` of up to `rows` rows;
        a batch's rows are what iterating the source gives, one by one."""
        return self._guarded(self._batches(rows))

    def _guarded(self, items: Iterator) -> Iterator:
        try:
            yield from items
        except (OSError, EOFError, ValueError, lzma.LZMAError) as e:
            # a stream that breaks mid-file (truncated gzip, corrupt zstd frame)
            raise ReaderError(f"{self.path} is unreadable after {self.done()} {self.unit}: {e}") from e

    def _open_parquet(self):
        import pyarrow as pa

        from workers.stages.records import open_parquet

        try:
            return open_parquet(self._raw)
        except (pa.ArrowException, OSError) as e:
            raise ReaderError(f"{self.path} is not a readable Parquet file: {e}") from e

    def _batches(self, rows: int) -> Iterator[tuple[int, Any]]:
        n = 0
        for batch in self._parquet.iter_batches(batch_size=rows):
            yield n + 1, batch
            n += batch.num_rows
            self._rows_done = n

    def _parquet_rows(self) -> Iterator[tuple[int, Any]]:
        n = 0
        for _first, batch in self._batches(1024):
            for row in batch.to_pylist():
                n += 1
                yield n, row

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _buffered(stream: Any) -> io.BufferedReader:
    # BufferedReader needs only readinto()/readable(); typeshed asks for a RawIOBase, which the
    # decompressors (BufferedIOBase, zstandard's reader) are not by name.
    return io.BufferedReader(stream, STREAM_BUF)


def _decompressor(magic: bytes, raw) -> tuple[str | None, io.BufferedReader]:
    if magic[:2] == b"\x1f\x8b":
        return "gzip", _buffered(gzip.GzipFile(fileobj=raw, mode="rb"))
    if magic[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return "zstd", _buffered(zstandard.ZstdDecompressor().stream_reader(raw, read_size=STREAM_BUF))
    if magic[:3] == b"BZh":
        return "bz2", _buffered(bz2.BZ2File(raw, "rb"))
    if magic[:6] == b"\xfd7zXZ\x00":
        return "xz", _buffered(lzma.LZMAFile(raw, "rb"))
    return None, _buffered(raw)


def _json_lines(stream, limit: int) -> Iterator[tuple[int, Any]]:
    readline = stream.readline
    n = 0
    first = True
    while True:
        line = readline(limit)
        if not line:
            return
        n += 1
        if first:
            line = line.removeprefix(b"\xef\xbb\xbf")
            first = False
        if line[-1:] != b"\n" and len(line) >= limit:
            # Over the limit: drop the rest of this line without holding it.
            size = len(line)
            while True:
                more = readline(STREAM_BUF)
                size += len(more)
                if not more or more[-1:] == b"\n":
                    break
            yield n, Bad(f"line is longer than the {limit >> 20} MiB limit ({size} bytes)")
            continue
        if line.isspace():
            continue
        yield n, line


# Outside strings only brackets and quotes matter for finding where a value ends; a string is
# matched whole by one regex (escapes included), so the Python loop runs per string, not per
# byte.
_TOKEN = re.compile(rb'[\[\]{}"]')
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)
_SCALAR_END = re.compile(rb"[,\]\s]")
_SKIP = re.compile(rb"[\s,]*+")


def _skip(buf: bytes, pos: int) -> int:
    """The position after any blanks and commas from pos (the pattern matches the empty string,
    so it always matches)."""
    match = _SKIP.match(buf, pos)
    assert match is not None
    return match.end()


def _json_array(stream, limit: int) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array, each as its bytes, without parsing the array.

    The scanner only finds element boundaries (bracket depth outside strings), so one
    malformed element is one reject and the next element is still found."""
    buf = b""
    while True:  # up to the first byte that is not a BOM or blank
        chunk = stream.read(READ_BUF)
        buf += chunk
        if chunk and len(buf) < 3 and b"\xef\xbb\xbf".startswith(buf):
            continue  # maybe a BOM, not whole yet
        pos = _skip(buf, 3 if buf.startswith(b"\xef\xbb\xbf") else 0)
        if pos < len(buf) or not chunk:
            break
    if buf[pos:pos + 1] != b"[":
        raise ReaderError("expected a JSON array")
    pos += 1
    eof = False
    index = 0
    while True:
        pos = _skip(buf, pos)
        if pos >= len(buf):
            if eof:
                raise ReaderError(f"the JSON array is not closed (the file ends after element {index})")
            chunk = stream.read(READ_BUF)
            eof = not chunk
            buf, pos = buf[pos:] + chunk, 0
            continue
        if buf[pos] == 0x5D:  # ]
            return
        start = scan = pos
        depth = 0
        want = READ_BUF
        while True:
            end, scan, depth = _scan(buf, scan, depth, eof)
            if end is not None:
                break
            if len(buf) - start > limit:
                raise ReaderError(f"element {index + 1} is larger than the {limit >> 20} MiB limit; "
                                  "a JSON array this large cannot be streamed")
            if eof:
                yield index + 1, Bad("the file ends inside this element (truncated JSON)")
                return
            # The element runs past the buffer: keep it and read more. Reads grow so that
            # rescanning a long string stays linear overall.
            chunk = stream.read(want)
            eof = not chunk
            buf, scan, start = buf[start:] + chunk, scan - start, 0
            want = min(want * 2, 64 << 20)
        index += 1
        yield index, buf[start:end]
        pos = end


def _scan(buf: bytes, scan: int, depth: int, eof: bool) -> tuple[int | None, int, int]:
    """Continue scanning one element from `scan` at bracket `depth`.
    Returns (end or None when the buffer ends first, where to resume, depth)."""
    if depth == 0 and buf[scan] not in (0x7B, 0x5B, 0x22):  # a scalar (or garbage)
        m = _SCALAR_END.search(buf, scan)
        if m is not None:
            return m.start(), scan, 0
        return (len(buf) if eof else None), scan, 0
    while True:
        m = _TOKEN.search(buf, scan)
        if m is None:
            return None, len(buf), depth
        i = m.start()
        t = buf[i]
        if t == 0x22:  # a string: match it whole
            s = _STRING.match(buf, i)
            if s is None:
                return None, i, depth
            scan = s.end()
            if depth == 0:
                return scan, scan, 0
        else:
            depth += 1 if t in (0x7B, 0x5B) else -1
            scan = i + 1
            if depth <= 0:
                return scan, scan, 0
