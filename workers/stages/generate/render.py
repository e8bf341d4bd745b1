"""Chat templating for generation: the prompt ids a backend receives, and the split of a
generated text into reasoning and content.

Prompts are rendered here, once, for every backend (vLLM gets token ids, not messages), so
both backends see identical prompts and the template recorded in the meta is the one used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.resolved import ResolvedTarget
from workers.stages.common import template_sha256

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class RenderError(Exception):
    """The template refused this conversation (e.g. Qwen3.5/3.6 'No user query found')."""


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them: reasoning under `reasoning_content` (the name
    the Qwen3 family templates use; without it they would look for `<think>` in content)."""
    out = []
    for m in messages:
        t = {k: v for k, v in m.items() if v is not None}
        if m.get("reasoning") is not None:
            t["reasoning_content"] = m["reasoning"]
        out.append(t)
    return out


@dataclass
class PromptRenderer:
    tokenizer: Any
    template: str  # the template text actually used
    kwargs: dict

    @classmethod
    def for_target(cls, tokenizer: Any, target: ResolvedTarget, override: str | None,
                   kwargs: dict) -> "PromptRenderer":
        """Template precedence: stage param override > the target's override > the tokenizer's."""
        chosen = override if override is not None else target.chat_template
        # get_chat_template resolves a named-template dict to its text, and raises when the
        # tokenizer has none: we want the text itself for the sha and to pass it explicitly.
        text = tokenizer.get_chat_template(chosen)
        merged = {**target.chat_template_kwargs, **(kwargs or {})}
        return cls(tokenizer=tokenizer, template=text, kwargs=merged)

    @property
    def sha256(self) -> str:
        return template_sha256(self.template)

    def render(self, messages: list[dict], tools: list | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                template_messages(messages), tools=tools, chat_template=self.template,
                add_generation_prompt=True, tokenize=False, **self.kwargs)
        except Exception as e:  # jinja raise_exception, TypeError, ...
            raise RenderError(f"{type(e).__name__}: {e}") from e

    def encode(self, text: str) -> list[int]:
        # The template already writes any BOS it wants (apply_chat_template does the same).
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        # Special tokens (<|im_end|>, pad) are markup, not answer; <think> is not special
        # in the Qwen3 tokenizer and survives, which split_reasoning relies on.
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def opens_think(prompt_text: str) -> bool:
    """True when the prompt ends inside a think block (Qwen3.5/3.6 thinking mode writes
    `<|im_start|>assistant\\n<think>\\n`), so the completion starts as reasoning."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def split_reasoning(text: str, prompt_open: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a generated text. reasoning is None when the answer has no
    think block (thinking off: the prompt already closed an empty one)."""
    if THINK_CLOSE in text:
        head, _, tail = text.partition(THINK_CLOSE)
        if not prompt_open:
            stripped = head.lstrip()
            if stripped.startswith(THINK_OPEN):
                head = stripped[len(THINK_OPEN):]
        return head.strip("\n"), tail.lstrip("\n")
    if prompt_open:
        return text.strip("\n"), ""  # ran out of tokens while thinking
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN):].strip("\n"), ""
    return None, text
