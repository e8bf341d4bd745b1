"""Message-level normalization shared by every input format.

A normalized message is a 6-tuple in the column order of `records.MESSAGE_TYPE`:

    (role, content, reasoning, tool_calls, name, tool_call_id)

Tuples rather than dicts because ingest is a hot loop (one tuple per message, transposed into
Arrow columns once per batch); `tool_calls` is already the JSON string the dataset stores.
"""

from __future__ import annotations

from typing import Any

import orjson

Msg = tuple  # (role, content, reasoning, tool_calls, name, tool_call_id)


class NoMatch(Exception):
    """The object does not have the shape of the format tried (try another one)."""


class Reject(Exception):
    """The object has the format's shape but cannot be used; the message is the reason."""


def loads_field(value: str, field: str) -> Any:
    """Some dumps store a nested field as a JSON string (glaive `conversations`, `tools`)."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise Reject(f"{field} is a string but not valid JSON ({e})") from None


def text(value: Any, where: str) -> str:
    """Content as one string: plain strings, None (tool-call turns), or OpenAI text parts."""
    if type(value) is str:
        return value
    if value is None:
        return ""
    if type(value) is list:
        parts = []
        for p in value:
            if type(p) is str:
                parts.append(p)
            elif type(p) is dict and type(p.get("text")) is str:
                parts.append(p["text"])
            else:
                kind = p.get("type") if type(p) is dict else type(p).__name__
                raise Reject(f"{where}: non-text content part ({kind})")
        # HF chat templates concatenate text parts without a separator; do the same.
        return "".join(parts)
    raise Reject(f"{where}: content is {type(value).__name__}, not text")


def split_think(content: str) -> tuple[str | None, str]:
    """`<think>r</think>a` -> (r, a), the way the Qwen3 templates split it (reasoning is what
    precedes `</think>`, minus an opening `<think>`; the answer is what follows the last
    `</think>`). A bare `</think>` (the opening tag was in the generation prompt) splits too."""
    head, _, tail = content.rpartition("</think>")
    i = head.find("<think>")
    if i >= 0:
        head = head[i + 7:]
    reasoning = head.strip("\n")
    return (reasoning or None), tail.lstrip("\n")


def _is_blank(s: str) -> bool:
    return not s or s.isspace()


def user(content: str, where: str) -> Msg:
    if _is_blank(content):
        raise Reject(f"empty content in {where} (user)")
    return ("user", content, None, None, None, None)


def assistant(content: str, where: str, reasoning: Any = None, tool_calls: str | None = None,
              split: bool = True) -> Msg:
    if reasoning is not None and type(reasoning) is not str:
        raise Reject(f"{where}: reasoning is {type(reasoning).__name__}, not text")
    if split and not reasoning and "</think>" in content:
        reasoning, content = split_think(content)
    if _is_blank(content) and not tool_calls and not reasoning:
        raise Reject(f"empty content in {where} (assistant)")
    return ("assistant", content, reasoning or None, tool_calls, None, None)


def tool(content: str, name: Any = None, tool_call_id: Any = None) -> Msg:
    # An empty tool result is legitimate (a call that returns nothing), so it is kept.
    return ("tool", content, None, None,
            name if type(name) is str else None,
            str(tool_call_id) if tool_call_id is not None else None)


def _call(c: Any, where: str) -> dict:
    if type(c) is not dict:
        raise Reject(f"{where}: a tool call is {type(c).__name__}, not an object")
    fn = c.get("function")
    if type(fn) is not dict:
        fn = c  # ShareGPT/glaive calls are {"name", "arguments"} with no "function" wrapper
    name = fn.get("name")
    if type(name) is not str or not name:
        raise Reject(f"{where}: a tool call has no function name")
    args = fn.get("arguments", fn.get("parameters"))
    if type(args) is str:
        # Stored decoded (records.py), so templates that `tojson` the arguments render them
        # as objects; a string that is not JSON is kept as written.
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            pass
    out = {"type": "function", "function": {"name": name, "arguments": {} if args is None else args}}
    if c.get("id") is not None:
        out["id"] = str(c["id"])
    return out


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def call_list(value: Any, where: str) -> list[dict]:
    """Tool calls (OpenAI list, a single call, or a JSON string of either) -> list of
    `{"type": "function", "function": {"name", "arguments"}}` (plus `id` when given)."""
    if not value:
        return []
    if type(value) is str:
        value = loads_field(value, f"{where} tool call")
    if type(value) is dict:
        value = [value]
    if type(value) is not list:
        raise Reject(f"{where}: tool_calls is {type(value).__name__}, not a list")
    return [_call(c, where) for c in value]


def tool_calls(value: Any, where: str) -> str | None:
    """`call_list` as the JSON string the dataset stores, None when there are none."""
    calls = call_list(value, where)
    return dumps(calls) if calls else None


def tools(value: Any) -> str | None:
    """Tool schemas -> JSON list in the OpenAI shape `{"type": "function", "function": {...}}`
    (the shape `apply_chat_template(tools=...)` produces); bare `{"name", "parameters"}`
    schemas, as in glaive/ShareGPT dumps, are wrapped."""
    if value is None or value == "" or value == []:
        return None
    if type(value) is str:
        value = loads_field(value, "tools")
    if type(value) is dict:
        value = [value]
    if type(value) is not list:
        raise Reject(f"tools is {type(value).__name__}, not a list")
    out = []
    for t in value:
        if type(t) is not dict:
            raise Reject("tools: a tool schema is not an object")
        out.append(t if ("type" in t or "function" in t) else {"type": "function", "function": t})
    return orjson.dumps(out).decode() if out else None


def check_record(msgs: list) -> None:
    if not msgs:
        raise Reject("no messages")
    for m in msgs:
        if m[0] != "system":
            return
    raise Reject("only system messages")


def own_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if type(value) in (str, int):
        return str(value)
    return None
