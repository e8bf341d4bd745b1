"""Rows of generated turns from the token ids the target produced (docs/FIELD-NOTES.md, "Generation":
decoding and re-tokenizing the text does not round-trip).

A dataset from the generate stage carries `token_ids.parquet`: per generated turn the prompt
ids the target was given and the completion ids it returned (its end-of-turn token included
when it stopped on one). A row built from them is exactly the sequence the target produced in
the context it produced it in; re-rendering the record's text with the chat template and
tokenizing it is not (Qwen3's template renders an earlier answer without the think block it
was generated after, a `\\n\\n` merges differently, ...).

Rows of a record with generated turns (turns in message order):

* A row is `prompt_ids + completion_ids` of one generated turn; its loss mask is 1 exactly on
  the completion (end-of-turn token included when the target emitted it).
* An earlier generated turn k joins that row when the row begins with exactly
  `prompt_ids_k + completion_ids_k` (the template kept the history as it was generated):
  with train_on=all its completion is trained there too; with train_on=last it stays masked
  (only the last generated turn is trained, one row).
* Under train_on=all, a generated turn that no later turn's row contains that way (Qwen3's
  template strips the empty think block of answers before the last user turn, so the history
  differs from what was generated) gets a row of its own: every generated token is trained
  once, each in the context it was generated in, and nothing else is. The prompt of such a
  row repeats the earlier context (masked tokens only); for prefix-preserving templates a
  multi-turn record stays one row.
* seq_length and length_policy apply to each row as on the text path; a row they reject is
  dropped, and the record is rejected (with that row's reason) only when none is left.
* Assistant turns inside a prompt that the target did not generate (kept from the input:
  tool-call turns, or earlier turns of a `turns=last` generation) are never trained on this
  path: the target did not produce them.

Records without token ids (not regenerated, failed, or an ingested dataset) keep the text
path (masks.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workers.stages.prepare.masks import Encoded
from workers.stages.prepare.spans import RecordRejected

COLUMNS = ("id", "turn", "prompt_ids", "completion_ids")
TURNS_KEY = "_token_turns"  # where a chunk's record carries its turns to a worker


class TokenIndex:
    """The token_ids file, sorted by (id, turn), with each id's row range."""

    def __init__(self, table: pa.Table):
        self.table = table.sort_by([("id", "ascending"), ("turn", "ascending")])
        self._where: dict[str, tuple[int, int]] = {}
        ids = self.table.column("id").to_pylist()
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or ids[k] != ids[start]:
                self._where[ids[start]] = (start, k - start)
                start = k
        self.num_turns = len(ids)

    def __len__(self) -> int:
        return len(self._where)

    def turns(self, rid: str) -> list[dict] | None:
        w = self._where.get(rid)
        return self.table.slice(*w).to_pylist() if w else None

    @classmethod
    def load(cls, path: Path) -> "TokenIndex":
        schema = pq.read_schema(path)
        missing = [c for c in COLUMNS if c not in schema.names]
        if missing:
            raise ValueError(f"{path.name} lacks the columns {missing}")
        return cls(pq.read_table(path, columns=list(COLUMNS)))


def encode_token_turns(record: dict, turns: list[dict], train_on: str) -> list[Encoded]:
    """The rows of one record from its generated turns (module docstring); raises
    RecordRejected("token_ids_mismatch") when the turns do not fit the record's messages."""
    msgs = record["messages"]
    turns = sorted(turns, key=lambda t: t["turn"])
    for t in turns:
        i = t["turn"]
        if not (0 <= i < len(msgs)) or msgs[i]["role"] != "assistant":
            raise RecordRejected("token_ids_mismatch", f"token ids of turn {i}, but message "
                                 f"{i} of {len(msgs)} is not an assistant turn")
        if not t["completion_ids"]:
            raise RecordRejected("token_ids_mismatch", f"turn {i} has no completion ids")
    seqs = [np.asarray(list(t["prompt_ids"]) + list(t["completion_ids"]), dtype=np.int64)
            for t in turns]
    for t, seq in zip(turns, seqs):
        if len(seq) and seq.min() < 0:
            raise RecordRejected("token_ids_mismatch", f"turn {t['turn']} has a negative "
                                 f"token id ({int(seq.min())})")
    starts = [len(t["prompt_ids"]) for t in turns]
    if train_on == "last":
        groups = [[len(turns) - 1]]
    else:
        # Walk back from the last turn: a turn joins the latest row that begins with exactly
        # its sequence, else it opens a row of its own.
        heads: list[int] = []     # the turn whose sequence is a row, latest first
        groups_of: dict[int, list[int]] = {}
        for k in range(len(turns) - 1, -1, -1):
            host = next((h for h in heads if len(seqs[h]) >= len(seqs[k])
                         and np.array_equal(seqs[h][:len(seqs[k])], seqs[k])), None)
            if host is None:
                heads.append(k)
                groups_of[k] = [k]
            else:
                groups_of[host].append(k)
        groups = [sorted(groups_of[h]) for h in sorted(heads)]
    rows = []
    for g in groups:
        head = g[-1]
        ids = seqs[head]
        mask = np.zeros(len(ids), dtype=np.int64)
        spans = []
        for k in g:
            mask[starts[k]:len(seqs[k])] = 1
            spans.append((starts[k], len(seqs[k])))
        rows.append(Encoded(ids, mask, spans))
    return rows
