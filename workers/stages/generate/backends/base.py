"""The interface both generation backends implement.

The stage renders prompts itself and hands a backend token ids, so the two backends see
identical prompts; a backend only continues them. It returns, per request, the prompt ids it
used, the generated ids (ending with the EOS token when the model stopped on its own: a
drafter must learn to emit it), the text, and why it stopped. Per-request failures come back
as results with `error` set; a failure of the backend itself (server died) raises.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Per-record failure reasons a backend may report (the stage adds prompt_too_long,
# template_error, empty_answer, nothing_to_generate itself).
SERVER_ERROR = "server_error"
PROMPT_TOO_LONG = "prompt_too_long"


@dataclass(frozen=True)
class SamplingConfig:
    """What decides the tokens. Recorded in the artifact meta; the model's own
    generation_config defaults (e.g. Qwen's top_k=20) are deliberately not applied."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    stop: tuple[str, ...] = ()
    # Generation ends at any of these (the tokenizer's EOS plus the model's generation_config
    # eos ids), so both backends stop on the same tokens.
    eos_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenRequest:
    key: str  # "<record id>#<message index>", unique within one generate() call
    prompt_ids: list[int]
    max_tokens: int  # already clamped to the context left after the prompt
    seed: int  # derived from (params.seed, record id, turn): stable across restarts


@dataclass
class GenResult:
    key: str
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS or a stop string) | "length"
    error: str | None = None  # a failure reason code; None on success
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


OnResult = Callable[[GenResult], None]


class GenerateBackend(ABC):
    name: str = "base"
    # Longest sequence (prompt + completion) the backend can run; None when unknown.
    context_len: int | None = None

    @abstractmethod
    def generate(self, requests: Sequence[GenRequest],
                 on_result: OnResult | None = None) -> list[GenResult]:
        """Results in the order of `requests`; `on_result` is called as each one finishes."""

    def close(self) -> None:  # noqa: B027  optional
        """Release the model / stop the server. Safe to call twice."""

    def __enter__(self) -> "GenerateBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_at_stop(ids: list[int], decode: Callable[[list[int]], str],
                     stops: Sequence[str]) -> list[int] | None:
    """The shortest prefix of `ids` whose text contains a stop string (the stop string kept,
    like vLLM's include_stop_str_in_output), or None when none occurs."""
    if not stops or not any(s in decode(ids) for s in stops):
        return None
    lo, hi = 1, len(ids)
    # Decoding a prefix gives a prefix of the text (up to a partial multi-byte character),
    # so "contains a stop" is monotone in the prefix length and bisection finds the first.
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo]
