"""Why a drafter is accepted or rejected, with the numbers that say so.

A verdict that accepts whatever was measured stops nothing: the seeds' drafter reached 1.1%
acceptance and was served. So "accept" needs a floor (`min_tau`), a measured gain over the
baseline (`min_gain`, by default over an untrained drafter of the same config), and the same
gain over prompt lookup, the baseline that costs nothing (prompt_lookup.py).
The diagnostics are what evaluate can count cheaply to explain a low tau: how many of the
target's reference tokens the drafter cannot propose at all (they are outside its draft
vocabulary, so no draft at those positions can be accepted), and acceptance per position.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from contracts.evaluate import EvalParams

# Above this out-of-vocabulary share the verdict names the draft vocabulary as the likely
# cause: a quarter of the positions then cannot be drafted at all, which caps acceptance.
OOV_CAUSE_SHARE = 0.25


def draft_vocab_coverage(draft_model: Any, references: Sequence[Sequence[int]],
                         tokenizer: Any = None, top: int = 5) -> dict:
    """Share of reference tokens outside the drafter's draft vocabulary (its t2d map).

    A drafter without a map drafts over the full target vocabulary: nothing is outside.
    """
    tokens = [int(t) for ref in references for t in ref]
    t2d = getattr(draft_model, "t2d", None)
    out: dict[str, Any] = {"reference_tokens": len(tokens), "draft_vocab_size": None,
                           "oov_tokens": 0, "oov_share": 0.0 if tokens else None,
                           "top_oov": []}
    if t2d is None or not tokens:
        return out
    inside = t2d.detach().to("cpu").bool()  # shape: [target vocab]; True = draftable
    out["draft_vocab_size"] = int(inside.sum())
    oov = Counter(t for t in tokens if t >= len(inside) or not bool(inside[t]))
    n = sum(oov.values())
    out["oov_tokens"] = n
    out["oov_share"] = n / len(tokens)
    out["top_oov"] = [{"id": t, "count": c,
                       **({"text": tokenizer.decode([t])} if tokenizer is not None else {})}
                      for t, c in oov.most_common(top)]
    return out


def _pairs(report: dict) -> list[tuple[str, float | None, float | None]]:
    """(measure, drafter tau, baseline tau), most faithful measure first."""
    base = report.get("baseline") or {}
    return [("vLLM", (report.get("vllm") or {}).get("tau"), None),
            ("greedy speculative decoding", report.get("tau"), base.get("tau")),
            ("simulated (teacher-forced)", report.get("tau_sim"), base.get("tau_sim"))]


def verdict(report: dict, p: EvalParams) -> tuple[str, str]:
    """("accept" | "reject", the reason with the numbers)."""
    pairs = [x for x in _pairs(report) if x[1] is not None]
    if not pairs:
        return "reject", "no acceptance measure produced a value (no usable prompts or rows)"
    key, tau, _ = pairs[0]
    assert tau is not None  # the pairs kept have a value
    problems: list[str] = []
    passed: list[str] = []
    if p.min_tau is not None:
        (problems if tau < p.min_tau else passed).append(
            f"tau {tau:.3f} ({key}) {'is below' if tau < p.min_tau else 'meets'} "
            f"min_tau {p.min_tau}")
    else:
        passed.append(f"tau {tau:.3f} ({key}); no min_tau set")
    # The gain is compared on one measure both were measured with (the baseline has no vLLM).
    same = next(((k, t, b) for k, t, b in pairs if b is not None), None)
    base = report.get("baseline") or {}
    who = "the untrained baseline" if base.get("kind") == "untrained" else "the baseline"
    if p.min_gain is not None and same is not None:
        k, t, b = same
        assert t is not None and b is not None
        gain = t - b
        msg = f"{'beats' if gain > 0 else 'does not beat'} {who}'s tau {b:.3f} by {gain:+.3f} " \
              f"({k}; min_gain {p.min_gain})"
        (problems if gain < p.min_gain else passed).append(msg)
    elif p.min_gain is not None:
        passed.append("no baseline measured, so the gain over it is not checked")
    lookup = _prompt_lookup_check(report, p)
    if lookup is not None:
        (problems if lookup[0] else passed).append(lookup[1])
    note = _lossless_note(report)
    if report.get("evaluated_on"):  # what the numbers were measured on
        note += f"; measured {report['evaluated_on']}"
    if problems:
        return "reject", "; ".join(problems) + _cause(report) + note
    return "accept", "; ".join(passed) + note


def _prompt_lookup_check(report: dict, p: EvalParams) -> tuple[bool, str] | None:
    """(fails, message) of "beats prompt lookup by min_gain", on greedy speculative decoding
    (the one measure both have); None when either tau is missing or min_gain is off.

    Prompt lookup needs no training and no GPU-days (docs/STYLE.md rule 20): a drafter that
    does not beat it is not worth serving, whatever it gains over an untrained drafter.
    """
    pl = report.get("prompt_lookup") or {}
    tau, pl_tau = report.get("tau"), pl.get("tau")
    if p.min_gain is None or tau is None or pl_tau is None:
        return None
    gain = tau - pl_tau
    fails = gain < p.min_gain
    ngrams = f"n-grams {pl.get('prompt_lookup_min')}-{pl.get('prompt_lookup_max')}"
    return fails, (f"tau {tau:.3f} {'does not beat' if gain <= 0 else 'beats'} prompt "
                   f"lookup's tau {pl_tau:.3f} by {gain:+.3f} (greedy speculative decoding, "
                   f"{ngrams}; min_gain {p.min_gain})")


def _cause(report: dict) -> str:
    cov = (report.get("diagnostics") or {}).get("draft_vocab") or {}
    share = cov.get("oov_share")
    if not share:
        return ""
    text = (f"; {share:.0%} of the {cov['reference_tokens']} reference tokens are outside "
            f"the drafter's {cov['draft_vocab_size']}-token draft vocabulary")
    if share >= OOV_CAUSE_SHARE:
        text += (" (likely cause: the drafter cannot propose them; build the draft vocabulary "
                 "from data like the evaluation's, or a larger draft_vocab_size)")
    return text


def _lossless_note(report: dict) -> str:
    lossless = report.get("lossless") or {}
    if lossless.get("checked") and lossless.get("equal") != lossless.get("checked"):
        return (f"; note: {lossless['checked'] - lossless['equal']} of {lossless['checked']} "
                f"speculative outputs differ from plain greedy output")
    return ""


def diagnostics(report: dict, coverage: dict) -> dict:
    """What explains the numbers: draft-vocabulary coverage and acceptance per position."""
    base = report.get("baseline") or {}
    return {
        "draft_vocab": coverage,
        "acceptance_rate_per_position": report.get("acceptance_rate_per_position")
        or report.get("acceptance_rate_per_position_sim") or [],
        "baseline_acceptance_rate_per_position": base.get("acceptance_rate_per_position")
        or base.get("acceptance_rate_per_position_sim") or [],
        "prompt_lookup_acceptance_rate_per_position":
            (report.get("prompt_lookup") or {}).get("acceptance_rate_per_position") or [],
    }
