"""Prompt lookup: the free baseline every trained drafter must beat (docs/STYLE.md rule 20).

The n-gram proposer of vLLM's `ngram` speculative method (vllm/v1/spec_decode/
ngram_proposer.py, `_find_longest_matched_ngram_and_propose_tokens`), re-stated plainly: over
the prompt and the text generated so far, find the longest suffix n-gram, n from
`prompt_lookup_max` down to `prompt_lookup_min`, that also occurs earlier; propose the (at
most k) tokens that followed it. Of several earlier occurrences vLLM takes the earliest
(its KMP scan over the reversed tokens keeps the last position it sees), and so does this.
No match: no proposal, and the step verifies the anchor alone (tau counts it as 1).

It plugs into the same greedy loop as a trained drafter (specdec.speculative_greedy), so its
tau and per-position acceptance are measured exactly like the drafter's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ngram_propose(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to `k` tokens following the earliest earlier occurrence of the longest suffix
    n-gram of `tokens` (min_n <= n <= max_n); [] when none occurs."""
    total = len(tokens)
    if k <= 0 or total < min_n:
        return []
    seq = list(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = seq[total - n:]
        first = suffix[0]
        # A match must start before the suffix itself (it may overlap it).
        for start in range(0, total - n):
            if seq[start] == first and seq[start:start + n] == suffix:
                follow = start + n
                return seq[follow:follow + k]
    return []


class PromptLookupProposer:
    """The drafter interface of specdec.speculative_greedy over `ngram_propose`."""

    kind = "prompt_lookup"

    def __init__(self, num_spec: int, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= prompt_lookup_min ({min_n}) <= "
                             f"prompt_lookup_max ({max_n})")
        self.num_spec = int(num_spec)
        self.min_n, self.max_n = int(min_n), int(max_n)

    def reset(self) -> None:
        pass

    def extend(self, aux: Any) -> None:
        pass  # reads tokens only, no hidden states

    def propose(self, tokens: list[int]) -> list[int]:
        return ngram_propose(tokens, self.min_n, self.max_n, self.num_spec)
