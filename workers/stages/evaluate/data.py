"""Held-out evaluation data: tokenized rows (input_ids + loss_mask) and prompts.

Tokenized artifacts are read in the layout `speculators train` reads (an HF dataset saved with
`save_to_disk`, columns `input_ids` and `loss_mask`); parquet or JSONL files with the same
columns are accepted too. Prompts come from a dataset artifact (records.py layout: the
messages before the last assistant turn, rendered with the chat template and the generation
prompt) or from the prompt part of tokenized rows (the tokens before the first trained one).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from workers.stages.common import StageError

Row = tuple[list[int], list[int]]


def _as_list(x: Any) -> list[int]:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def _saved_dataset_dir(root: Path) -> Path | None:
    for cand in (root, *sorted(p for p in root.iterdir() if p.is_dir())):
        if (cand / "dataset_info.json").is_file() or (cand / "state.json").is_file():
            return cand
    return None


def load_tokenized_rows(path: Path | str, limit: int | None = None, seed: int = 0) -> list[Row]:
    """(input_ids, loss_mask) rows of a tokenized artifact; a seeded sample of `limit` rows."""
    root = Path(path)
    if not root.is_dir():
        raise StageError("invalid_input", f"tokenized data path {root} is not a folder")
    rows: list[Row] = []
    saved = _saved_dataset_dir(root)
    if saved is not None:
        from datasets import load_from_disk

        ds = load_from_disk(str(saved))
        if hasattr(ds, "keys") and not hasattr(ds, "column_names"):  # a DatasetDict
            ds = ds[min(ds.keys())]
        cols = set(ds.column_names)
        _need_columns(cols, root)
        idx = _sample(len(ds), limit, seed)
        for i in idx:
            r = ds[int(i)]
            rows.append((_as_list(r["input_ids"]), _as_list(r["loss_mask"])))
        return rows
    files = sorted(root.glob("*.parquet")) or sorted(root.glob("*.jsonl"))
    if not files:
        raise StageError("invalid_input", f"no tokenized rows at {root}: expected an HF dataset "
                         f"saved with save_to_disk, or parquet/jsonl files")
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(f)
            _need_columns(set(table.column_names), root)
            ids = table.column("input_ids").to_pylist()
            masks = table.column("loss_mask").to_pylist()
            rows.extend((_as_list(a), _as_list(b)) for a, b in zip(ids, masks, strict=True))
        else:
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    r = json.loads(line)
                    _need_columns(set(r), root)
                    rows.append((_as_list(r["input_ids"]), _as_list(r["loss_mask"])))
    return [rows[i] for i in _sample(len(rows), limit, seed)]


def _need_columns(cols: set[str], root: Path) -> None:
    missing = {"input_ids", "loss_mask"} - cols
    if missing:
        raise StageError("invalid_input", f"tokenized data at {root} lacks column(s) "
                         f"{sorted(missing)} (has {sorted(cols)})")


def _sample(n: int, limit: int | None, seed: int) -> list[int]:
    """All indices when they fit, else a seeded sample kept in file order."""
    if limit is None or n <= limit:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def prompts_from_rows(rows: list[Row]) -> list[list[int]]:
    """The tokens before the first trained token of each row (rows without one are skipped)."""
    out = []
    for ids, mask in rows:
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is not None and first > 0:
            out.append(ids[:first])
    return out


def prompts_from_dataset(path: Path | str, tokenizer: Any, chat_template: str | None,
                         template_kwargs: dict, limit: int, seed: int,
                         sources: list[str] | None = None) -> tuple[list[list[int]], int]:
    """Rendered prompt token ids of a seeded sample of records, and how many failed to render.

    A record's prompt is its messages before the last assistant turn (all of them when it
    has none), rendered with the generation prompt, so the target continues where the
    record's last answer started. `sources`, when given, gets each prompt's source dataset
    (`source_name`), in the order of the prompts.
    """
    from workers.stages.records import count_records, iter_records

    n = count_records(path)
    want = set(_sample(n, limit, seed))
    prompts: list[list[int]] = []
    failed = 0
    for i, rec in enumerate(iter_records(path)):
        if i not in want:
            continue
        msgs = rec["messages"]
        last_asst = max((j for j, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        head = msgs[:last_asst] if last_asst is not None else msgs
        if not head:
            failed += 1
            continue
        try:
            text = tokenizer.apply_chat_template(
                head, tools=rec.get("tools"), tokenize=False, add_generation_prompt=True,
                chat_template=chat_template, **template_kwargs)
        except Exception:  # noqa: BLE001  a template refusing one record skips that record
            failed += 1
            continue
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        if sources is not None:
            sources.append(source_name(rec.get("source")))
    return prompts, failed


def source_name(source: str | None) -> str:
    """The dataset a record came from: its `source` is `<dataset name>:<line>` (ingest), kept
    through a mix (workers/stages/mix.py), so a mixed set splits by it."""
    s = source or ""
    return s.rsplit(":", 1)[0] if ":" in s else s
