"""Input formats: detection of one parsed object, and a normalizer per format.

A normalizer takes one parsed JSON object and returns one record
`(own_id | None, messages, tools_json | None)`, or a list of such records (OpenAssistant trees
give one per path). It raises `NoMatch` when the object lacks the format's key fields and
`Reject(reason)` when it has them but cannot be used. Messages are `messages.Msg` tuples.

Prompt-only inputs (no answer field, an empty answer, a conversation that ends on a user turn)
become records without a final assistant turn: `generate` fills them, nothing is invented here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts.ingest import FORMATS
from workers.stages.ingest import messages as M
from workers.stages.ingest.messages import NoMatch, Reject

Record = tuple  # (own_id | None, list[Msg], tools_json | None)

# ShareGPT speaker names seen in public dumps (FastChat, LLaMA-Factory, glaive, ShareGPT4).
# Keyed by role names, looked up with whatever a record holds there (None included).
SHAREGPT_ROLES: dict[Any, str] = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
    "model": "assistant", "claude": "assistant", "system": "system",
    "function_call": "function_call", "observation": "tool", "tool": "tool",
    "function": "tool", "function_response": "tool", "tool_response": "tool"}


def _reasoning(m: dict) -> Any:
    r = m.get("reasoning_content")
    if r is None:
        r = m.get("reasoning")
        if r is None:
            r = m.get("thinking")
    return r


def _system(out: list, value: Any, where: str) -> None:
    # Empty system prompts are how OpenOrca and others say "no system prompt": dropped.
    if value is not None:
        s = M.text(value, where)
        if s and not s.isspace():
            out.append(("system", s, None, None, None, None))


def openai(obj: dict) -> Record:
    msgs = obj.get("messages")
    if type(msgs) is not list:
        if msgs is None:
            raise NoMatch
        if type(msgs) is str:
            msgs = M.loads_field(msgs, "messages")
        if type(msgs) is not list:
            raise Reject(f"messages is {type(msgs).__name__}, not a list")
    rid, tools = obj.get("id"), obj.get("tools")
    return (M.own_id(rid) if rid is not None else None, _openai_messages(msgs),
            M.tools(tools) if tools else None)


def _openai_messages(msgs: list) -> list:
    # The hot loop of most ingests: plain user/assistant turns take the inline path, the rest
    # (reasoning fields, tool calls, think tags, content parts) go through messages.py.
    out: list = []
    append = out.append
    for i, m in enumerate(msgs, 1):
        if type(m) is not dict:
            raise Reject(f"message {i} is {type(m).__name__}, not an object")
        role = m.get("role")
        c = m.get("content")
        if type(c) is not str:
            c = M.text(c, f"message {i}")
        if role == "user":
            if not c or c.isspace():
                raise Reject(f"empty content in message {i} (user)")
            append(("user", c, None, None, None, None))
        elif role == "assistant":
            if len(m) == 2 and "</think>" not in c and c and not c.isspace():
                append(("assistant", c, None, None, None, None))
            else:
                tc = m.get("tool_calls") or m.get("function_call")
                append(M.assistant(c, f"message {i}", _reasoning(m),
                                   M.tool_calls(tc, f"message {i}") if tc else None))
        elif role == "system" or role == "developer":
            if c and not c.isspace():
                append(("system", c, None, None, None, None))
        elif role == "tool" or role == "function":
            append(M.tool(c, m.get("name"), m.get("tool_call_id")))
        else:
            raise Reject(f"message {i}: unknown role {role!r}")
    M.check_record(out)
    return out


def sharegpt(obj: dict) -> Record:
    conv = obj.get("conversations")
    if type(conv) is not list:
        if conv is None:
            conv = obj.get("conversation")
            if conv is None:
                raise NoMatch
        if type(conv) is str:
            conv = M.loads_field(conv, "conversations")
        if type(conv) is not list:
            raise Reject(f"conversations is {type(conv).__name__}, not a list")
    out: list = []
    append = out.append
    system = obj.get("system")
    if system is not None:  # LLaMA-Factory keeps the system prompt beside the turns
        _system(out, system, "system")
    last_fn = None
    for i, m in enumerate(conv, 1):
        if type(m) is str:  # LIMA: `conversations` is a list of strings, user first
            m = {"from": "human" if i % 2 else "gpt", "value": m}
        if type(m) is not dict:
            raise Reject(f"turn {i} is {type(m).__name__}, not an object")
        speaker = m.get("from")
        if speaker is None:  # some dumps use OpenAI keys inside `conversations`
            speaker, v = m.get("role"), m.get("content")
        else:
            v = m.get("value")
        role = SHAREGPT_ROLES.get(speaker)
        if role is None:
            role = SHAREGPT_ROLES.get(speaker.lower()) if type(speaker) is str else None
            if role is None:
                raise Reject(f"turn {i}: unknown speaker {speaker!r}")
        if type(v) is not str:
            v = M.text(v, f"turn {i}")
        if role == "user":
            if not v or v.isspace():
                raise Reject(f"empty content in turn {i} (user)")
            append(("user", v, None, None, None, None))
        elif role == "assistant":
            if len(m) == 2 and v and "</think>" not in v and not v.isspace():
                append(("assistant", v, None, None, None, None))  # the common case, inline
            else:
                append(M.assistant(v, f"turn {i}", _reasoning(m)))
        elif role == "function_call":
            # glaive/LLaMA-Factory: the assistant's turn is a call `{"name", "arguments"}`.
            calls = M.call_list(v, f"turn {i}")
            if not calls:
                raise Reject(f"empty content in turn {i} (function_call)")
            last_fn = calls[-1]["function"]["name"]
            append(("assistant", "", None, M.dumps(calls), None, None))
        elif role == "tool":
            # The observation answers the call before it; its name is carried for the
            # templates that print it.
            append(M.tool(v, last_fn))
        else:
            _system(out, v, f"turn {i}")
    M.check_record(out)
    rid, tools = obj.get("id"), obj.get("tools")
    return (M.own_id(rid) if rid is not None else None, out, M.tools(tools) if tools else None)


def _pairs(out: list, history: Any) -> None:
    """Alpaca `history`: [[user, assistant], ...] turns before the instruction."""
    if type(history) is not list:
        raise Reject("history is not a list")
    for j, pair in enumerate(history, 1):
        if type(pair) is not list or len(pair) != 2:
            raise Reject(f"history item {j} is not a [user, assistant] pair")
        out.append(M.user(M.text(pair[0], f"history {j}"), f"history {j}"))
        out.append(M.assistant(M.text(pair[1], f"history {j}"), f"history {j}"))


def _single_turn(prompt: Any, answer: Any, where_p: str, where_a: str,
                 system: Any = None, where_s: str = "system") -> list:
    """[system?, user, assistant?]. A missing or empty answer leaves a prompt-only record."""
    out: list = []
    if system is not None:
        _system(out, system, where_s)
    if type(prompt) is not str:
        prompt = M.text(prompt, where_p)
    if not prompt or prompt.isspace():
        raise Reject(f"empty content in {where_p} (user)")
    out.append(("user", prompt, None, None, None, None))
    if answer is not None:
        if type(answer) is not str:
            answer = M.text(answer, where_a)
        if answer and not answer.isspace():
            out.append(("assistant", answer, None, None, None, None) if "</think>" not in answer
                       else M.assistant(answer, where_a))
    return out


def _rid(obj: dict) -> str | None:
    rid = obj.get("id")
    return M.own_id(rid) if rid is not None else None


def alpaca(obj: dict) -> Record:
    """Alpaca and Evol-CodeAlpaca (`instruction`, optional `input`, `output` or `response`).
    The input follows the instruction after a blank line, as LLaMA-Factory joins them."""
    ins = obj.get("instruction")
    if ins is None:
        raise NoMatch
    inp = obj.get("input")
    if inp:
        ins = f"{M.text(ins, 'instruction')}\n\n{M.text(inp, 'input')}"
    ans = obj.get("output")
    if ans is None:
        ans = obj.get("response")
    out = _single_turn(ins, ans, "instruction", "output", obj.get("system"))
    history = obj.get("history")
    if history:
        head: list = [m for m in out if m[0] == "system"]
        _pairs(head, history)
        out = head + [m for m in out if m[0] != "system"]
    return (_rid(obj), out, None)


def openorca(obj: dict) -> Record:
    """OpenOrca (`system_prompt`, `question`, `response`); `answer` is read where `response`
    is missing (GSM8K-style question/answer files land here too)."""
    q = obj.get("question")
    if q is None:
        raise NoMatch
    ans = obj.get("response")
    if ans is None:
        ans = obj.get("answer")
    return (_rid(obj), _single_turn(q, ans, "question", "response",
                                     obj.get("system_prompt"), "system_prompt"), None)


def magicoder(obj: dict) -> Record:
    p = obj.get("problem")
    if p is None:
        raise NoMatch
    rid = obj.get("id")
    if rid is None:
        rid = obj.get("index")
    return (M.own_id(rid) if rid is not None else None,
            _single_turn(p, obj.get("solution"), "problem", "solution"), None)


def ultrachat(obj: dict) -> Record:
    """UltraChat: `data` is the turns as strings, user first, alternating."""
    data = obj.get("data")
    if type(data) is not list:
        raise NoMatch
    out = []
    for i, t in enumerate(data, 1):
        where = f"turn {i}"
        if type(t) is not str:
            t = M.text(t, where)
        out.append(M.user(t, where) if i % 2 else M.assistant(t, where))
    M.check_record(out)
    return (_rid(obj), out, None)


def prompt(obj: dict) -> Record:
    """Bare prompts (`prompt` or `text`); a `completion`/`response` string, or TRL's
    conversational `prompt`/`completion` message lists, give the assistant turn."""
    p = obj.get("prompt")
    if p is None:
        p = obj.get("text")
        if p is None:
            raise NoMatch
    c = obj.get("completion")
    if c is None:
        c = obj.get("response")
    if type(p) is list or type(c) is list:
        out = (_openai_messages(p) if type(p) is list
               else _single_turn(p, None, "prompt", "", obj.get("system")))
        if type(c) is list:
            out.extend(_openai_messages(c))
        elif c:
            out.append(M.assistant(M.text(c, "completion"), "completion"))
    else:
        out = _single_turn(p, c, "prompt", "completion", obj.get("system"))
    return (_rid(obj), out, None)


OASST_ROLES: dict[Any, str] = {"prompter": "user", "assistant": "assistant", "user": "user"}


def _oasst_children(node: dict) -> list:
    """The replies a path follows: the best-ranked one (lowest `rank`, first on ties) when the
    replies are ranked, else every reply (unranked siblings are distinct conversations)."""
    reps = [r for r in node.get("replies") or ()
            if type(r) is dict and not r.get("deleted") and type(r.get("text")) is str
            and r["text"].strip()]
    ranked = [r for r in reps if type(r.get("rank")) is int]
    if ranked:
        return [min(ranked, key=lambda r: r["rank"])]
    return reps


def oasst(obj: dict) -> list[Record]:
    """OpenAssistant tree export (`message_tree_id`, nested `prompt.replies`): one record per
    root-to-leaf path through the best-ranked replies. Id: the tree id, plus `/<leaf message
    id>` when the tree gives several paths."""
    if "message_tree_id" in obj:
        root = obj.get("prompt")
    elif "replies" in obj and "text" in obj:
        root = obj  # a bare tree node
    else:
        raise NoMatch
    if type(root) is not dict:
        raise Reject("prompt is not a message tree")
    if root.get("deleted"):
        raise Reject("the tree's root message is deleted")
    paths: list[list[dict]] = []
    stack = [[root]]
    while stack:
        path = stack.pop()
        kids = _oasst_children(path[-1])
        if not kids:
            paths.append(path)
        # reversed so that paths come out in reply order
        stack.extend(path + [k] for k in reversed(kids))
    tree_id = M.own_id(obj.get("message_tree_id") or root.get("message_id"))
    out = []
    for path in paths:
        msgs = []
        for i, node in enumerate(path, 1):
            role = OASST_ROLES.get(node.get("role"))
            where = f"message {i} of the path to {path[-1].get('message_id')}"
            if role is None:
                raise Reject(f"{where}: unknown role {node.get('role')!r}")
            t = M.text(node.get("text"), where)
            msgs.append(M.user(t, where) if role == "user" else M.assistant(t, where))
        leaf = M.own_id(path[-1].get("message_id"))
        rid = tree_id if (len(paths) == 1 or tree_id is None or leaf is None) else f"{tree_id}/{leaf}"
        out.append((rid, msgs, None))
    return out


NORMALIZERS: dict[str, Callable[[dict], Record | list[Record]]] = {
    "openai": openai,
    "sharegpt": sharegpt,
    "alpaca": alpaca,
    "openorca": openorca,
    "oasst": oasst,
    "ultrachat": ultrachat,
    "magicoder": magicoder,
    "evol_codealpaca": alpaca,  # same fields; detection tells them apart for the report
    "prompt": prompt,
    "oasst_flat": oasst,  # never called per row: ingest groups the rows (oasst_flat.py)
}
if set(NORMALIZERS) != set(FORMATS):  # the one list is contracts/ingest.py's
    raise TypeError(f"ingest normalizes {sorted(NORMALIZERS)}, contracts/ingest.py lists "
                    f"{sorted(FORMATS)}")


def detect_one(obj: dict) -> str | None:
    """The format of one object from its keys, or None. Order matters where shapes overlap:
    Alpaca has `input` where Evol-CodeAlpaca has none."""
    if "messages" in obj:
        return "openai"
    if "conversations" in obj or "conversation" in obj:
        return "sharegpt"
    if "parent_id" in obj and "message_id" in obj and "replies" not in obj:
        # one message of the flat OpenAssistant export (oasst_flat.py groups them into trees)
        return "oasst_flat" if "text" in obj and "role" in obj else None
    if "message_tree_id" in obj or ("replies" in obj and "text" in obj and "role" in obj):
        return "oasst"
    if "question" in obj:
        return "openorca"
    if "problem" in obj:
        return "magicoder"
    if "instruction" in obj:
        if "input" in obj or not ("output" in obj or "response" in obj):
            return "alpaca"
        return "evol_codealpaca"
    if type(obj.get("data")) is list:
        return "ultrachat"
    if "prompt" in obj or "text" in obj:
        return "prompt"
    return None


def shape_hint(obj: dict) -> str:
    """A short description of an object nobody recognizes, for reject reasons and errors."""
    keys = list(obj)[:8]
    hint = ""
    if {"message_id", "parent_id", "text"} <= set(obj):
        hint = "; this looks like the flat OpenAssistant message export, whose rows need `role`"
    return f"keys: {', '.join(map(str, keys)) or '(none)'}{hint}"
