"""Which turns of a record get the target's answer, and the record's state while they do.

An assistant turn that calls tools is kept as it is: the tool results after it answer that
call, and a new call could not be run. A record that ends on a user or tool turn gets a new
answer appended (a prompt-only record gets one answer).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field


def answer_positions(messages: list[dict], mode: str) -> list[int]:
    """Message indices that receive a generated answer; len(messages) means 'append'."""
    pos = [i for i, m in enumerate(messages)
           if m["role"] == "assistant" and not m.get("tool_calls")]
    if messages and messages[-1]["role"] in ("user", "tool"):
        pos.append(len(messages))
    if mode == "last":
        if not messages or (messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls")):
            return []  # the final turn is a tool call: no final answer to regenerate
        return pos[-1:]
    return pos


def turn_seed(seed: int, record_id: str, position: int) -> int:
    """A per-turn seed that does not depend on batching or on where a restart resumed."""
    h = hashlib.sha256(f"{seed}:{record_id}:{position}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


@dataclass
class RecordJob:
    index: int  # position in the input dataset
    record: dict  # as records.from_row gives it
    positions: list[int]
    messages: list[dict] = field(default_factory=list)
    step: int = 0  # positions[:step] are answered
    turns: list[dict] = field(default_factory=list)  # token ids per generated turn
    failure: str | None = None
    failure_detail: str | None = None

    @classmethod
    def create(cls, index: int, record: dict, mode: str) -> "RecordJob":
        msgs = copy.deepcopy(record["messages"])
        return cls(index=index, record=record, positions=answer_positions(msgs, mode),
                   messages=msgs)

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def done(self) -> bool:
        return self.failure is not None or self.step >= len(self.positions)

    @property
    def position(self) -> int:
        return self.positions[self.step]

    @property
    def key(self) -> str:
        return f"{self.id}#{self.position}"

    def history(self) -> list[dict]:
        """The conversation before the answer being generated (earlier answers are the
        target's own once generated)."""
        return self.messages[: self.position]

    def fail(self, reason: str, detail: str | None = None) -> None:
        self.failure, self.failure_detail = reason, detail

    def answer(self, reasoning: str | None, content: str, prompt_ids: list[int],
               completion_ids: list[int], finish_reason: str) -> None:
        pos = self.position
        msg = {"role": "assistant", "content": content, "reasoning": reasoning}
        if pos == len(self.messages):
            self.messages.append(msg)
        else:
            # Keep name etc. of the original turn; only the answer itself is replaced.
            self.messages[pos] = {**self.messages[pos], **msg}
        self.turns.append({"turn": pos, "prompt_ids": prompt_ids,
                           "completion_ids": completion_ids, "finish_reason": finish_reason})
        self.step += 1

    def output(self) -> dict:
        out = {k: v for k, v in self.record.items() if k != "messages"}
        out["messages"] = self.messages
        return out
