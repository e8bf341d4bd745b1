"""Chat templates compiled and rendered the way transformers renders them.

We render ourselves instead of calling `tokenizer.apply_chat_template` because the mask method
needs two things transformers does not give: the `{% generation %}` character spans without
its token mapping (transformers#47325: the mask runs to the end of the sequence when a span
ends on stripped whitespace), and a render whose `strftime_now` is frozen for the whole job so
that every record of a run sees the same date (gpt-oss puts `Current date` in its system block).
The environment copies transformers 5.x `_cached_compile_jinja_template`: an immutable sandbox
with `trim_blocks`, `lstrip_blocks`, loopcontrols, `raise_exception`, `strftime_now` and a
`tojson` that does not escape HTML or non-ASCII. `tests/stages/test_prepare_templates.py`
checks that our renders equal `apply_chat_template(tokenize=False)` on every fixture template.

A template text is used byte-exact, never rewritten: what a drafter is trained on must be what
the server renders. (The chujiezheng `vicuna.jinja` is meant to be whitespace-stripped before
use; stripping is the operator's job, done before the text reaches draftyard.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.runtime import new_context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from workers.stages.common import StageError, template_sha256

_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


class _GenerationTracker(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: records the character span of each block.

    Same tag and semantics as transformers' AssistantTracker; the spans are collected in
    `environment.generation_spans` while a tracked render runs (renders are not concurrent
    within a process: one job, one thread).
    """

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_blocks=None, generation_spans=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

    def _track(self, caller):
        rv = caller()
        env = self.environment
        if env.generation_blocks is not None:
            start = sum(len(b) for b in env.generation_blocks)
            env.generation_spans.append((start, start + len(rv)))
        return rv


_DICT_ATTRS = frozenset(dir(dict))
# The str methods jinja's sandbox wraps (`wrap_str_format`): never on a shortcut.
_FORMAT = frozenset(("format", "format_map"))
_BUILTIN_METHOD = type("".strip)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with shortcuts that keep its semantics exactly.

    Rendering was a fifth of prepare's time, and most of it went to `message.content` on plain
    dicts (jinja first tries the attribute, and every miss raises and catches an
    AttributeError) and to re-deciding that `str.strip` or `loop.last` is safe. A dict key
    that is not a dict attribute is looked up directly; safety verdicts are cached per (type,
    name), the only things jinja's `is_safe_attribute` / `is_internal_attribute` /
    `modifies_known_mutable` look at, and an attribute already judged safe is returned
    without asking again. A call of a builtin method (`content.split('</think>')`) goes
    straight to it: such a method cannot carry jinja's `pass_context` or `unsafe_callable`
    marks (a StopIteration it raises still becomes undefined, as in jinja), and `format` /
    `format_map` still take the sandbox's path.
    """

    # What a tracked render collects (ChatTemplate.render_tracked sets both, _GenerationTracker
    # appends to them); None outside one.
    generation_blocks: list[str] | None = None
    generation_spans: list[tuple[int, int]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._safe: dict[tuple[type, str], bool] = {}

    def getattr(self, obj, attribute):
        t = type(obj)
        if t is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        if self._safe.get((t, attribute)) and attribute not in _FORMAT:
            try:
                return getattr(obj, attribute)
            except AttributeError:
                pass  # jinja's path: the item of that name, else undefined
        return super().getattr(obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # jinja's signature
        if type(__obj) is _BUILTIN_METHOD and __obj.__name__ not in _FORMAT:
            kwargs.pop("_loop_vars", None)
            kwargs.pop("_block_vars", None)
            try:
                return __obj(*args, **kwargs)
            except StopIteration:  # as jinja's Context.call (a generator's `send`)
                return __self.undefined("value was undefined because a callable raised a "
                                        "StopIteration exception")
        return super().call(__context, __obj, *args, **kwargs)

    def is_safe_attribute(self, obj, attr, value):
        key = (type(obj), attr)
        ok = self._safe.get(key)
        if ok is None:
            ok = self._safe[key] = super().is_safe_attribute(obj, attr, value)
        return ok


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class TemplateRenderError(Exception):
    """The template raised while rendering one record (its own `raise_exception` or a type
    error on an unexpected message shape). The message is the template's own."""


def _compile(text: str, now: datetime) -> jinja2.Template:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env.from_string(text)


def check_template(text: str) -> str | None:
    """None if the template compiles, else the Jinja message with its line number."""
    try:
        _compile(text, datetime.now())
    except jinja2.TemplateSyntaxError as e:
        return f"{e.message} (line {e.lineno})"
    except jinja2.TemplateError as e:  # pragma: no cover - other compile-time errors
        return str(e)
    return None


@dataclass
class ChatTemplate:
    """A compiled chat template plus the variables transformers passes next to the messages."""

    text: str
    special_tokens: dict[str, str]   # bos_token, eos_token, ... as transformers passes them
    kwargs: dict[str, Any]           # chat_template_kwargs (enable_thinking, ...)
    now: datetime                    # what strftime_now returns, frozen for the job

    def __post_init__(self) -> None:
        try:
            self._tmpl = _compile(self.text, self.now)
        except jinja2.TemplateSyntaxError as e:
            raise StageError("template_error", f"{e.message} (line {e.lineno})") from None
        self.sha256 = template_sha256(self.text)
        self.has_generation = bool(_GENERATION_RE.search(self.text))
        # kwargs overwrite special tokens, as in apply_chat_template
        self._vars = {**self.special_tokens, **self.kwargs}
        # What `Template.render` builds on every call from the environment's globals (a
        # ChainMap, read key by key in Python: a tenth of a render), built once.
        self._globals = dict(self._tmpl.globals)
        self._parent = {**self._globals, **self._vars}

    def _blocks(self, messages: list[dict], tools: list | None, add_generation_prompt: bool):
        """The render's output pieces: `Template.generate` with the context's variables
        merged once (`_parent`); a fresh dict per call, as the template's own assignments go
        to the context, never to it."""
        tmpl = self._tmpl
        ctx = new_context(tmpl.environment, tmpl.name, tmpl.blocks,
                          {**self._parent, "messages": messages, "tools": tools,
                           "documents": None, "add_generation_prompt": add_generation_prompt},
                          shared=True, globals=self._globals)
        return tmpl.root_render_func(ctx)

    def render(self, messages: list[dict], tools: list | None = None,
               add_generation_prompt: bool = False) -> str:
        try:
            return "".join(self._blocks(messages, tools, add_generation_prompt))
        except jinja2.TemplateError as e:
            raise TemplateRenderError(e.message or str(e)) from None
        except Exception as e:  # noqa: BLE001  any error inside the template is the record's
            raise TemplateRenderError(f"{type(e).__name__}: {e}") from None

    def render_tracked(self, messages: list[dict], tools: list | None = None
                       ) -> tuple[str, list[tuple[int, int]]]:
        """Render and return the character spans of the `{% generation %}` blocks."""
        env = self._tmpl.environment
        assert isinstance(env, _Sandbox)  # _compile builds every template in one
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        env.generation_blocks, env.generation_spans = blocks, spans
        try:
            for block in self._blocks(messages, tools, False):
                blocks.append(block)
        except jinja2.TemplateError as e:
            raise TemplateRenderError(e.message or str(e)) from None
        except Exception as e:  # noqa: BLE001
            raise TemplateRenderError(f"{type(e).__name__}: {e}") from None
        finally:
            env.generation_blocks, env.generation_spans = None, None
        return "".join(blocks), spans


def special_tokens_of(tokenizer) -> dict[str, str]:
    """The special-token variables transformers passes to a template (`special_tokens_map`)."""
    return {k: str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}


def resolve_template_text(tokenizer, override: str | None) -> str:
    """The override text, else the tokenizer's own template (the `default` one if named)."""
    if override:
        return override
    tmpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tmpl, dict):
        tmpl = tmpl.get("default")
    if not tmpl:
        raise StageError("template_error",
                         "the tokenizer has no chat template and none was given "
                         "(params.chat_template or the target's chat_template)")
    return tmpl


def to_template_messages(messages: list[dict]) -> list[dict]:
    """Normalized record messages -> the dicts chat templates read.

    Reasoning goes under every name a template family reads it by: `reasoning_content`
    (Qwen3.x, DeepSeek, vLLM), `thinking` (gpt-oss), `reasoning`. A template that reads none of
    them drops it, and then it is not trained: we train what the template renders.
    """
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        r = m.get("reasoning")
        if r is not None:
            d["reasoning_content"] = r
            d["thinking"] = r
            d["reasoning"] = r
        tc = m.get("tool_calls")
        if tc:
            d["tool_calls"] = json.loads(tc) if isinstance(tc, str) else tc
        for k in ("name", "tool_call_id"):
            if m.get(k):
                d[k] = m[k]
        out.append(d)
    return out
