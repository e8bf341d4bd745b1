"""Where each assistant turn lies in a rendered conversation (character spans).

Two methods, both reading one rendering of the whole conversation, so they hold on templates
that are not prefix-preserving (Qwen3.x think stripping, Phi-3.5's trailing EOS, gpt-oss
`<|return|>` vs `<|end|>`; SOURCES.md), where render-the-prefix-and-diff breaks:

* `{% generation %}` blocks, where the template has them: the template author says what the
  model produces.
* Otherwise, anchors. The record is rendered a second time with marker strings (private-use
  characters) placed inside each assistant message's content, reasoning and tool-call names,
  after any leading and before any trailing whitespace, so `trim`, `strip('\\n')`, `lstrip`
  and `</think>` splitting leave them in place. The marked render, markers removed, must
  equal the plain render, or the markers changed the template's logic and a less intrusive
  level is tried. A surviving marker proves "this part of the render belongs to assistant
  message i". The turn's span then runs
    - from the end of the generation-prompt header (what `add_generation_prompt=True` appends,
      measured once per template) found last before the turn's first anchor: everything
      after it is what the model produced at inference (`<think>\\n` for Qwen3, the analysis
      channel for gpt-oss, nothing of the header itself); when the template rendered a
      shortened header (Qwen3.5/3.6 drop `<think>\\n` in stripped turns), the longest
      whole-token prefix of the header that is found counts;
    - to the end of the first end-of-turn token after the turn's last anchor (`<|im_end|>`,
      `<|eot_id|>`, `<end_of_turn>`, `<|end|>`, `<|return|>`, `<|call|>`, `</s>`, ...), the
      token the model emits to stop. Template glue after the end token (Phi's `\\n` + EOS,
      ChatML's `\\n`) is prompt for the next turn, not output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from workers.stages.prepare.templates import ChatTemplate, TemplateRenderError

# Tokens that end an assistant turn in the template families we know. Only those that are
# added tokens of the tokenizer in use count, together with its eos token and the target's
# generation_config eos ids.
KNOWN_END_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>",
    "<|call|>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>",
    "<|END_OF_TURN_TOKEN|>", "<eos>",
)

# Marker delimiters: private-use code points no tokenizer treats as whitespace. A second pair
# is used for the rare record that already contains the first.
_MARK_PAIRS = (("\ue000", "\ue001"), ("\U000f0000", "\U000f0001"))
# A marker: <open><message index><field letter><tool-call index?><s|e><close>
_MARKER_RE = {(o, c): re.compile(f"{re.escape(o)}(\\d+)([a-z]\\d*[se]){re.escape(c)}")
              for o, c in _MARK_PAIRS}


class RecordRejected(Exception):
    """One record cannot be trained on; `code` is a stable reason key, `detail` the why."""

    def __init__(self, code: str, detail: str = ""):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


@dataclass
class Located:
    text: str                       # the plain rendering, the text that gets tokenized
    spans: list[tuple[int, int]]    # trained character spans [start, end), in order
    turns_without_end: int = 0      # trained turns after which no end-of-turn token was found
    turns_skipped: int = 0          # trained turns whose rendering is empty (not trained)


def answered(m: dict) -> bool:
    """An assistant message with something the model produced (not an empty placeholder)."""
    return m["role"] == "assistant" and bool(
        _has_text(m.get("content")) or _has_text(m.get("reasoning_content"))
        or m.get("tool_calls"))


def _has_text(s: str | None) -> bool:
    """`bool(s.strip())` without copying s."""
    return s is not None and s != "" and not s.isspace()


def trained_indices(msgs: list[dict], train_on: str) -> list[int]:
    idx = [i for i, m in enumerate(msgs) if answered(m)]
    if not idx:
        raise RecordRejected("needs_generate", "no assistant answer in the record")
    return idx if train_on == "all" else idx[-1:]


class SpanLocator:
    """Finds the trained character spans of a record for one template and tokenizer."""

    def __init__(self, template: ChatTemplate, header: str, header_prefixes: list[str],
                 end_tokens: list[str], train_on: str, use_generation: bool = True):
        self.template = template
        self.header = header
        # the header and its shorter whole-token prefixes, longest first
        self.header_candidates = [header] + header_prefixes if header else []
        self.end_tokens = end_tokens
        self.end_re = re.compile("|".join(re.escape(t) for t in
                                          sorted(end_tokens, key=len, reverse=True))) \
            if end_tokens else None
        self.train_on = train_on
        self.use_generation = use_generation and template.has_generation

    # -- public -------------------------------------------------------------------------
    def locate(self, msgs: list[dict], tools: list | None) -> Located:
        train = trained_indices(msgs, self.train_on)
        if self.use_generation:
            return self._locate_generation(msgs, tools)
        try:
            plain = self.template.render(msgs, tools)
        except TemplateRenderError as e:
            raise RecordRejected("template_error", str(e)) from None
        pair = _free_marker_pair(msgs)
        failure = ""
        # Level 1 anchors every answered turn; level 2 serves templates that compare tool
        # names (a turn that is only a tool call then has no anchor and is not trained).
        for level in (1, 2):
            marked_msgs = _mark(msgs, level, pair)
            try:
                marked = self.template.render(marked_msgs, tools)
            except TemplateRenderError as e:
                failure = f"the marked render raised: {e}"
                continue
            stripped, anchors = _strip_markers(marked, pair)
            if stripped != plain:
                failure = "markers change the template's output"
                continue
            try:
                return self._spans_from_anchors(plain, msgs, anchors, train)
            except _LevelFailed as e:
                failure = str(e)
        raise RecordRejected("mask_locate_failed", failure)

    # -- {% generation %} ---------------------------------------------------------------
    def _locate_generation(self, msgs, tools) -> Located:
        try:
            text, spans = self.template.render_tracked(msgs, tools)
        except TemplateRenderError as e:
            raise RecordRejected("template_error", str(e)) from None
        spans = [s for s in spans if s[1] > s[0]]
        if not spans:
            raise RecordRejected("mask_locate_failed", "the {% generation %} blocks are empty")
        return Located(text, spans if self.train_on == "all" else spans[-1:])

    # -- anchors ------------------------------------------------------------------------
    def _spans_from_anchors(self, text: str, msgs: list[dict], anchors: dict[int, list[int]],
                            train: list[int]) -> Located:
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        trained = set(train)
        spans: list[tuple[int, int]] = []
        no_end = skipped = 0
        lo = 0
        for n, i in enumerate(assistants):
            pos = anchors.get(i)
            if not pos:
                # None of its fields is in the rendering (tool calls under a template without
                # tool support): nothing the model produced is there to train.
                skipped += i in trained
                continue
            first, last = min(pos), max(pos)
            if first < lo:
                raise _LevelFailed(f"assistant message {i} overlaps the turn before it")
            start = self._header_end(text, lo, first)
            if start is None:
                raise _LevelFailed(f"no assistant header before message {i}")
            hi = len(text)
            for j in assistants[n + 1:]:
                if anchors.get(j):
                    hi = min(anchors[j])
                    break
            end, tok_start = self._turn_end(text, msgs, i, last, hi)
            if i in trained:
                if text[start:end if tok_start is None else tok_start].strip():
                    spans.append((start, end))
                    no_end += tok_start is None
                else:
                    # The template rendered nothing the model produced (tool calls under a
                    # template without tool support): an end token alone would teach the
                    # drafter to stop at once. Not trained.
                    skipped += 1
            lo = end
        if not spans:
            raise RecordRejected("empty_turns", "the template renders nothing of the trained "
                                 "assistant turns but their end tokens")
        return Located(text, spans, no_end, skipped)

    def _header_end(self, text: str, lo: int, first: int) -> int | None:
        if not self.header_candidates:
            return first
        # The latest-ending match wins: the real header sits right before the turn, and a
        # full header echoed in user text earlier must not pull the start into the prompt.
        best = None
        for cand in self.header_candidates:
            q = text.rfind(cand, lo, first)
            if q >= 0 and (best is None or q + len(cand) > best):
                best = q + len(cand)
        return best

    def _turn_end(self, text: str, msgs: list[dict], i: int, last: int, hi: int
                  ) -> tuple[int, int | None]:
        """(end of the turn, start of its end-of-turn token or None when there is none): the
        first end-of-turn token after the turn's last anchor and before `hi`."""
        m = self.end_re.search(text, last, hi) if self.end_re is not None else None
        if m is None:
            return last, None
        # A template without an end token after assistant turns (Alpaca-style headers) would
        # let the search run through the next message to some later EOS. The glue between the
        # last anchor and the end token is template text plus this message's own data (tool
        # arguments): if it holds the next message's text and this message does not, the
        # token belongs to a later turn.
        if i + 1 < len(msgs) and msgs[i + 1]["role"] != "assistant":
            nxt = (msgs[i + 1].get("content") or "").strip()
            if nxt and text.find(nxt, last, m.start()) >= 0 and nxt not in _own_text(msgs[i]):
                return last, None
        return m.end(), m.start()


def _own_text(m: dict) -> str:
    return (m.get("content") or "") + (m.get("reasoning_content") or "") + \
        json.dumps(m.get("tool_calls") or [], ensure_ascii=False)


class _LevelFailed(Exception):
    pass


def _free_marker_pair(msgs: list[dict]) -> tuple[str, str]:
    texts = [t for m in msgs for t in (m.get("content"), m.get("reasoning_content")) if t]
    for o, c in _MARK_PAIRS:
        if not any(o in t or c in t for t in texts):
            return o, c
    raise RecordRejected("mask_locate_failed", "the record contains the reserved marker "
                         "characters U+E000/U+E001 and U+F0000/U+F0001")


def _wrap(text: str, tag: str, pair: tuple[str, str]) -> str:
    """Markers around the whitespace-stripped core, so stripping filters keep them."""
    o, c = pair
    core = text.strip()
    if not core:  # names only: an empty tool name still gets its anchor
        return f"{text}{o}{tag}s{c}{o}{tag}e{c}"
    a = text.index(core[0])
    b = a + len(core)
    return f"{text[:a]}{o}{tag}s{c}{core}{o}{tag}e{c}{text[b:]}"


def _mark(msgs: list[dict], level: int, pair: tuple[str, str]) -> list[dict]:
    """Level 1 marks non-empty content and reasoning and tool-call names; level 2 only the
    text fields, for templates that compare tool names. Empty fields are never marked: a
    template may test their truthiness (Qwen3 puts a newline before a tool call only after
    non-empty content), and markers must not change what it renders."""
    out = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            out.append(m)
            continue
        d = dict(m)
        if _has_text(m["content"]):
            d["content"] = _wrap(m["content"], f"{i}c", pair)
        r = m.get("reasoning_content")
        if r is not None and _has_text(r):
            w = _wrap(r, f"{i}r", pair)
            d["reasoning_content"] = d["thinking"] = d["reasoning"] = w
        if level < 2 and m.get("tool_calls"):
            calls = []
            for k, call in enumerate(m["tool_calls"]):
                call = dict(call)
                if isinstance(call.get("function"), dict):
                    fn = dict(call["function"])
                    fn["name"] = _wrap(str(fn.get("name", "")), f"{i}n{k}", pair)
                    call["function"] = fn
                elif "name" in call:
                    call["name"] = _wrap(str(call["name"]), f"{i}n{k}", pair)
                calls.append(call)
            d["tool_calls"] = calls
        out.append(d)
    return out


def _strip_markers(marked: str, pair: tuple[str, str]) -> tuple[str, dict[int, list[int]]]:
    """Remove markers; return the text and, per message, the positions (in the stripped
    text) of the first occurrence of each of its markers."""
    rx = _MARKER_RE[pair]
    parts: list[str] = []
    anchors: dict[int, list[int]] = {}
    seen: set[str] = set()
    removed = 0
    prev = 0
    for m in rx.finditer(marked):
        parts.append(marked[prev:m.start()])
        prev = m.end()
        key = m.group(0)
        if key not in seen:  # a template may echo a field (gpt-oss repeats the tool name)
            seen.add(key)
            anchors.setdefault(int(m.group(1)), []).append(m.start() - removed)
        removed += m.end() - m.start()
    parts.append(marked[prev:])
    return "".join(parts), anchors
