"""The embedded broker (app/core/broker.py FilesystemTransport): a worker reading the message
folder while another process writes to it takes whole messages only. Found by the suite's
embedded backend (tests/conftest.py both_backends): with kombu's own filesystem channel the
worker took a message file created but not yet written, and died on decoding it (this test
failed 6 runs of 6 with it; 64 KB messages widen the window between create and write)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from queue import Empty

from kombu import Connection

from app.core.broker import FilesystemTransport

N = 1000  # messages of 64 KB


def _connection(folder: Path) -> Connection:
    return Connection("filesystem://", transport=FilesystemTransport, transport_options={
        "data_folder_in": str(folder / "in"), "data_folder_out": str(folder / "in"),
        "control_folder": str(folder / "control"), "processed_folder": str(folder / "done"),
        "store_processed": False})


def _send(folder: Path) -> None:
    with _connection(folder) as c:
        for i in range(N):
            c.default_channel._put("q", {"i": i, "body": "x" * 65536})


def test_a_reader_never_takes_a_half_written_message(tmp_path):
    for sub in ("in", "control", "done"):
        (tmp_path / sub).mkdir()
    # Another process, as the API is to the worker (fork: it needs nothing imported anew).
    sender = multiprocessing.get_context("fork").Process(target=_send, args=(tmp_path,))
    sender.start()
    got: list[int] = []
    with _connection(tmp_path) as c:
        ch = c.default_channel
        deadline = time.time() + 120
        while len(got) < N and time.time() < deadline:
            try:
                got.append(ch._get("q")["i"])  # a half-written file raised JSONDecodeError
            except Empty:
                time.sleep(0.001)
    sender.join(30)
    assert sorted(got) == list(range(N))
