"""Our template rendering equals transformers' `apply_chat_template(tokenize=False)` on every
fixture template, and a template that does not compile fails with the Jinja message and line."""

from __future__ import annotations

from datetime import datetime

import jinja2
import pytest

from tests.stages.prepare_support import TEMPLATE_FAMILY, A, S, T, U, m, small_tokenizer, tool_call

from workers.stages.common import StageError
from workers.stages.prepare.masks import build_masker
from workers.stages.prepare.templates import (
    ChatTemplate, TemplateRenderError, check_template, special_tokens_of, to_template_messages,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

CONVS = {
    "full": [m(S, "You are terse."), m(U, "Hi 👋"), m(A, " Hello!\n", reasoning="greets"),
             m(U, "Weather?"), m(A, "", tool_calls=[tool_call("get_weather", city="Paris")]),
             m(T, "sunny", name="get_weather"), m(A, "Sunny — 22°C.", reasoning="tool said")],
    "alternating": [m(U, "Hi"), m(A, "Hello"), m(U, "Bye"), m(A, "Bye!")],
    "user_only": [m(U, "Only a question")],
    "system_assistant": [m(S, "sys"), m(A, "orphan")],
    "late_system": [m(U, "q"), m(S, "late"), m(A, "x")],
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_FAMILY))
def test_render_equals_transformers(name, templates_dir):
    tok = small_tokenizer(TEMPLATE_FAMILY[name])
    text = (templates_dir / f"{name}.jinja").read_text()
    # gpt-oss prints today's date: freeze ours at the same day transformers sees
    tmpl = ChatTemplate(text, special_tokens_of(tok), {}, datetime.now())
    compared = 0
    for conv_name, conv in CONVS.items():
        msgs = to_template_messages(conv)
        for tools in (None, TOOLS if conv_name == "full" else None):
            for gen in (False, True):
                try:
                    want = tok.apply_chat_template(msgs, tools=tools, chat_template=text,
                                                   tokenize=False, add_generation_prompt=gen)
                except jinja2.TemplateError as e:
                    with pytest.raises(TemplateRenderError) as ours:
                        tmpl.render(msgs, tools, add_generation_prompt=gen)
                    assert str(ours.value) == e.message
                    continue
                assert tmpl.render(msgs, tools, add_generation_prompt=gen) == want, \
                    (name, conv_name, tools is not None, gen)
                compared += 1
    assert compared >= 4


def test_broken_template_fails_at_compile_with_message_and_line(templates_dir):
    text = (templates_dir / "vicuna_vllm_BROKEN_apostrophe.jinja").read_text()
    assert check_template(text) == "expected token 'end of statement block', got 's' (line 5)"
    with pytest.raises(StageError) as e:
        build_masker(small_tokenizer("vicuna"), text)
    assert e.value.code == "template_error"
    assert e.value.message == "expected token 'end of statement block', got 's' (line 5)"


def test_every_fixture_template_compiles_but_the_broken_one(templates_dir):
    results = {p.stem: check_template(p.read_text()) for p in templates_dir.glob("*.jinja")}
    assert {k for k, v in results.items() if v is not None} == {"vicuna_vllm_BROKEN_apostrophe"}
    assert set(TEMPLATE_FAMILY) == set(results) - {"vicuna_vllm_BROKEN_apostrophe"}


def test_generation_tag_detected(templates_dir):
    tok = small_tokenizer("chatml")
    has = {p.stem for p in templates_dir.glob("*.jinja") if "BROKEN" not in p.stem
           and ChatTemplate(p.read_text(), special_tokens_of(tok), {}, datetime.now()).has_generation}
    assert has == {"qwen3_6_training_generation_tags"}


# Our sandbox's shortcuts (templates.py `_Sandbox`, `ChatTemplate.render`) against jinja's own
# immutable sandbox with transformers' options: the same output, or the same error.
SANDBOX_CASES = {
    "str methods in a loop": "{% for x in messages %}{{ x.content.split('l')[0].upper() }}"
                             "{{ x.content.startswith('H') }}{% endfor %}",
    "dict get and items": "{{ messages[0].get('role') }}{{ messages[0].items() | list | length }}",
    "namespace in a loop": "{% set ns = namespace(n=0) %}{% for x in messages %}"
                           "{% set ns.n = ns.n + x.content | length %}{% endfor %}{{ ns.n }}",
    "loop attributes": "{% for x in messages %}{{ loop.index0 }}{{ loop.last }}{% endfor %}",
    "format_map": "{{ '{r}!'.format_map({'r': messages[0].role}) }}",
    "format reaches an attribute": "{{ '{0.__class__}'.format(messages) }}",
    "dunder chain": "{{ ''.__class__.__mro__ }}",
    "mutating a list": "{% set _ = messages.append(1) %}{{ messages | length }}",
    "mutating a dict": "{{ messages[0].update({'role': 'x'}) }}{{ messages[0].role }}",
    "raise_exception": "{% for x in messages %}{{ raise_exception('no ' + x.role) }}{% endfor %}",
    "a method on undefined": "{{ nothing.split('x') }}",
    "a missing key": "{{ messages[0].nope }}|{{ messages[0]['nope'] }}",
    "a builtin raising StopIteration": "{% set g = messages | map(attribute='role') %}"
                                       "{{ g.send(None) }}{{ g.send(None) }}[{{ g.send(None) }}]",
    "a top-level set stays in its render": "{% if y is defined %}leak{% endif %}{% set y = 1 %}"
                                           "{{ y }}",
}


def _reference_render(src: str, msgs: list[dict]) -> tuple[str, str]:
    """("ok", output) or (error type, message) from jinja's own sandbox."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    try:
        return "ok", env.from_string(src).render(messages=msgs, tools=None, documents=None,
                                                  add_generation_prompt=False)
    except jinja2.TemplateError as e:
        return "error", e.message or str(e)


@pytest.mark.parametrize("case", sorted(SANDBOX_CASES))
def test_our_sandbox_renders_and_refuses_as_jinjas_own(case):
    src = SANDBOX_CASES[case]
    tmpl = ChatTemplate(src, {}, {}, datetime.now())
    for _ in range(3):  # the shortcuts apply from the second access on (cached verdicts)
        msgs = to_template_messages([m(U, "Hello"), m(A, "Hi there")])
        want = _reference_render(src, [dict(x) for x in msgs])
        try:
            got = ("ok", tmpl.render(msgs))
        except TemplateRenderError as e:
            got = ("error", str(e))
        assert got == want, case
        assert [x["role"] for x in msgs] == ["user", "assistant"]  # nothing was mutated
