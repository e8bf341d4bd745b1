"""Prompt lookup, the free baseline: vLLM's `ngram` proposals on hand-made token sequences
(expected drafts written by hand), and the verdict rule that a drafter must beat it.

The stage-level check (evaluate on the tiny target reports prompt lookup's tau and
acceptance per position) is in test_evaluate.py's end-to-end stage test.
"""

from __future__ import annotations

import pytest

from contracts.evaluate import EvalParams
from workers.stages.evaluate.prompt_lookup import PromptLookupProposer, ngram_propose
from workers.stages.evaluate.verdict import verdict


@pytest.mark.parametrize("tokens, min_n, max_n, k, expected", [
    # vLLM's own docstring example: [4,2,3] never occurred before, [2,3] did (at 1); only
    # three tokens follow it, so three are proposed.
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),
    # The longest suffix n-gram wins: [5,6,7] (at 0) over the later, shorter [6,7].
    ([5, 6, 7, 9, 1, 6, 7, 8, 5, 6, 7], 2, 3, 3, [9, 1, 6]),
    # Of several earlier occurrences of the same n-gram, the earliest (as vLLM).
    ([1, 2, 8, 1, 2, 9, 1, 2], 2, 2, 2, [8, 1]),
    # No earlier occurrence of any suffix n-gram of length >= min_n: no proposal.
    ([1, 2, 3, 4], 2, 3, 4, []),
    # min_n is respected: only the 1-gram [1] recurs.
    ([1, 2, 3, 1], 2, 3, 2, []),
    ([1, 2, 3, 1], 1, 3, 2, [2, 3]),
    # A match may overlap the suffix; the proposal runs into it.
    ([7, 8, 9, 7, 8], 2, 2, 5, [9, 7, 8]),
    ([4, 4, 4, 4], 1, 3, 3, [4]),
    # The suffix itself is no match; too short a context proposes nothing.
    ([1], 1, 1, 3, []),
    ([], 1, 2, 3, []),
    # max_n caps the n-gram: with max 1 only the last token is looked up (earliest 3, at 0).
    ([3, 1, 9, 5, 3, 9, 5, 3], 1, 1, 2, [1, 9]),
    # ... with max 3 the 3-gram [9,5,3] (at 2) wins.
    ([3, 1, 9, 5, 3, 9, 5, 3], 1, 3, 2, [9, 5]),
])
def test_ngram_proposals_by_hand(tokens, min_n, max_n, k, expected):
    assert ngram_propose(tokens, min_n, max_n, k) == expected


def test_proposer_uses_the_drafters_k_and_refuses_a_bad_range():
    p = PromptLookupProposer(num_spec=2, min_n=1, max_n=2)
    p.reset()
    p.extend(None)
    assert p.propose([1, 2, 3, 1, 2]) == [3, 1]
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        PromptLookupProposer(num_spec=2, min_n=3, max_n=2)
    with pytest.raises(ValueError, match="must not exceed"):
        EvalParams(prompt_lookup_min=4, prompt_lookup_max=3)


def _report(tau: float, base: float, lookup: float | None) -> dict:
    return {"tau": tau, "tau_sim": None, "baseline": {"kind": "untrained", "tau": base},
            "prompt_lookup": None if lookup is None else {
                "tau": lookup, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
            "diagnostics": {}}


def test_a_drafter_below_prompt_lookup_is_rejected_with_both_numbers():
    """Far above the untrained drafter and min_tau, but not above prompt lookup by min_gain:
    reject, and the reason names prompt lookup with both taus."""
    p = EvalParams()  # min_tau 1.5, min_gain 0.2
    v, reason = verdict(_report(2.10, 1.00, 2.00), p)
    assert v == "reject"
    # The only failing check, so the whole reason (the passed ones are not listed).
    assert reason == ("tau 2.100 beats prompt lookup's tau 2.000 by +0.100 (greedy "
                      "speculative decoding, n-grams 2-5; min_gain 0.2)")

    v, reason = verdict(_report(1.90, 1.00, 2.40), p)
    assert v == "reject" and "tau 1.900 does not beat prompt lookup's tau 2.400" in reason

    v, reason = verdict(_report(2.60, 1.00, 2.00), p)
    assert v == "accept" and "beats prompt lookup's tau 2.000 by +0.600" in reason


def test_without_a_prompt_lookup_measure_the_rule_is_silent():
    """A report without prompt lookup (an old report, or no specdec) is judged as before;
    min_gain None switches the comparison off like the untrained one."""
    v, reason = verdict(_report(2.60, 1.00, None), EvalParams())
    assert v == "accept" and "prompt lookup" not in reason
    v, reason = verdict(_report(2.10, 1.00, 2.00), EvalParams(min_gain=None))
    assert v == "accept" and "prompt lookup" not in reason
