"""The flat OpenAssistant export (oasst1/oasst2 `*.messages.jsonl` or the HF parquet): one
message per row (`message_id`, `parent_id`, `role` prompter|assistant, `text`, `rank`,
`message_tree_id`, `deleted`), a tree's messages kept together. Rows are grouped into trees as
they stream by (a new `message_tree_id`, or a row without a parent when the export has no
tree ids); each finished tree is linked and read like the tree export (formats.oasst: one
record per root-to-leaf path through the best-ranked replies). Memory holds one tree.

A message whose parent is not among its tree's rows is rejected with its line: the export
must keep a tree's rows together (the official exports and the HF parquet do)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from workers.stages.ingest.formats import oasst
from workers.stages.ingest.messages import Reject

Record = tuple


def is_flat_message(obj: dict) -> bool:
    return "message_id" in obj and "parent_id" in obj and "text" in obj and "role" in obj


def _rank(value):
    """The HF parquet stores `rank` as a float column (NaN where unranked)."""
    if type(value) is float:
        return None if math.isnan(value) else int(value)
    return value


class FlatTrees:
    """Feed rows with add(); finished trees come back as (line, records | Reject) items."""

    def __init__(self) -> None:
        self._key: object = None
        self._rows: list[tuple[int, dict]] = []

    @property
    def pending(self) -> bool:
        return bool(self._rows)

    def add(self, line: int, obj: dict) -> Iterator[tuple[int, list[Record] | Reject]]:
        tree = obj.get("message_tree_id")
        key = tree if tree is not None else (obj.get("message_id") if obj.get("parent_id")
                                             is None else self._key)
        if self._rows and key != self._key:
            yield from self.flush()
        self._key = key
        self._rows.append((line, obj))

    def flush(self) -> Iterator[tuple[int, list[Record] | Reject]]:
        rows, self._rows, self._key = self._rows, [], None
        if not rows:
            return
        nodes: dict = {}
        for line, m in rows:
            node = {k: m.get(k) for k in ("message_id", "role", "text", "deleted", "lang")}
            node["rank"] = _rank(m.get("rank"))
            node["replies"] = []
            nodes[m["message_id"]] = (line, node, m.get("parent_id"))
        roots = []
        for mid, (line, node, parent) in nodes.items():
            if parent is None:
                roots.append((line, node))
            elif parent in nodes:
                nodes[parent][1]["replies"].append(node)
            else:
                yield line, Reject(f"message {mid}: its parent {parent} is not among the rows of "
                                   f"its tree (the flat export must keep a tree's messages "
                                   f"together, parents anywhere in the group)")
        for line, root in roots:
            tree_id = rows[0][1].get("message_tree_id") or root["message_id"]
            try:
                yield line, oasst({"message_tree_id": tree_id, "prompt": root})
            except Reject as e:
                yield line, e
