"""Per-sample hidden-state files in the layout `speculators train` reads.

One file per tokenized row, `hs_{idx}.safetensors` (idx = the row index in the tokenized
data set; hs_connectors' `FileTransfer.get_cached(idx)` opens exactly this name) holding

    hidden_states  [seq, num_stored_layers, hidden]   aux layers in order, then layer N
    token_ids      [seq] int64                          the row's input_ids

with no padding. speculators' `ArrowDataset` splits `hidden_states[:, :-1]` (aux, flattened
to [seq, aux * hidden]) from `hidden_states[:, -1]` (`verifier_last_hidden_states`).

The files are the pieces of a `kernel.ShardSet` (`samples(folder)`): each is written to a
dot-prefixed temp name and renamed, so a file under its final name is always complete: a
stage killed mid-write leaves only a temp file, which the next attempt deletes. There is
no per-file fsync (it would cost a disk flush per sample); the resume scan re-validates
headers and shapes instead, which also catches a file truncated by a crash of the whole
machine.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from workers.stages.kernel import ShardSet

SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
# Beside the scratch folder: what its files were made from (inputs, layers, dtype).
STATE_FILE = "extract_state.json"


def samples(folder: Path | str) -> ShardSet:
    """The `hs_<row>.safetensors` files of a scratch folder, keyed by row index."""
    folder = Path(folder)
    return ShardSet(folder, folder.parent / STATE_FILE, "hs_", ".safetensors")


def torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def write_sample(folder: Path, idx: int, hidden_states: Any, token_ids: Any) -> int:
    """Write one sample atomically; returns the file's size in bytes.

    hidden_states: [seq, layers, hidden] CPU tensor in the storage dtype.
    token_ids: [seq] CPU int64 tensor.
    """
    import torch
    from safetensors.torch import save_file

    if hidden_states.dim() != 3 or token_ids.dim() != 1 \
            or hidden_states.shape[0] != token_ids.shape[0]:
        raise ValueError(f"sample {idx}: hidden_states {tuple(hidden_states.shape)} and "
                         f"token_ids {tuple(token_ids.shape)} do not match")
    tensors = {"hidden_states": hidden_states.contiguous(),
               "token_ids": token_ids.to(torch.int64).contiguous()}
    final = samples(folder).commit(idx, lambda tmp: save_file(tensors, str(tmp)))
    return final.stat().st_size


class AsyncWriter:
    """Writes samples on a background thread so disk I/O overlaps the next forward.

    safetensors releases the GIL while it writes, so one thread keeps up with the model on
    the tiny targets and with a GPU alike; `max_pending` bounds the host memory held by
    samples waiting to be written.
    """

    def __init__(self, folder: Path, threads: int = 1, max_pending: int = 256):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hs-writer")
        self._pending: deque[Future] = deque()
        self.max_pending = max_pending
        self.bytes_written = 0
        self.samples_written = 0

    def _collect(self, block_until: int) -> None:
        while self._pending and (len(self._pending) > block_until or self._pending[0].done()):
            self.bytes_written += self._pending.popleft().result()  # re-raises a write error
            self.samples_written += 1

    def submit(self, idx: int, hidden_states: Any, token_ids: Any) -> None:
        self._pending.append(self._pool.submit(write_sample, self.folder, idx, hidden_states,
                                               token_ids))
        self._collect(self.max_pending)

    def drain(self) -> None:
        self._collect(0)

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


def check_sample_file(path: Path, seq_len: int, num_layers: int, hidden: int,
                      dtype: str) -> str | None:
    """None when the file's header says exactly what this run would write, else why not.
    Reads the header only (safetensors validates offsets and buffer coverage on open)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != {"hidden_states", "token_ids"}:
                return f"keys {sorted(keys)}"
            hs = f.get_slice("hidden_states")
            if list(hs.get_shape()) != [seq_len, num_layers, hidden]:
                return f"hidden_states shape {hs.get_shape()} != {[seq_len, num_layers, hidden]}"
            if hs.get_dtype() != SAFETENSORS_DTYPES[dtype]:
                return f"hidden_states dtype {hs.get_dtype()} != {SAFETENSORS_DTYPES[dtype]}"
            ti = f.get_slice("token_ids")
            if list(ti.get_shape()) != [seq_len] or ti.get_dtype() != "I64":
                return f"token_ids {ti.get_dtype()}{ti.get_shape()}"
    except Exception as e:  # noqa: BLE001  any unreadable file is simply redone
        return f"unreadable: {type(e).__name__}: {e}"
    return None


def scan_finished(folder: Path, seq_lens: dict[int, int], num_layers: int, hidden: int,
                  dtype: str, delete_bad: bool = True) -> tuple[set[int], dict[int, str]]:
    """Finished samples in a scratch folder that a retry may keep.

    Returns (good row ids, {row id: reason} for files removed: unreadable, wrong shape or
    dtype, or a row this run does not select). Read-only when delete_bad is False.
    """
    good: set[int] = set()
    bad: dict[int, str] = {}
    for idx, path in samples(folder).done().items():
        if idx not in seq_lens:
            reason: str | None = "not selected by this run"
        else:
            reason = check_sample_file(path, seq_lens[idx], num_layers, hidden, dtype)
        if reason is None:
            good.add(idx)
        else:
            bad[idx] = reason
            if delete_bad:
                path.unlink(missing_ok=True)
    return good, bad


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(total bytes, number of hs_ files) of a finished folder."""
    total = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
    return total, len(samples(folder).done())
