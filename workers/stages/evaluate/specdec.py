"""Real greedy speculative decoding with the transformers backend, and plain greedy decoding.

One step: the drafter proposes K tokens after the last committed token (the anchor); the
target runs [anchor, d_1..d_K] in one forward over its KV cache; d_i is accepted while it
equals the target's argmax at its position; the target's argmax after the accepted prefix is
the bonus token. The step commits accepted + 1 tokens, so the mean acceptance length tau
counts the bonus token (vLLM's convention) and lies in [1, K + 1]. Rejected tokens are rolled
back from the cache. Because every committed token is the target's own argmax given the
committed prefix, the output must equal plain greedy decoding token for token; `lossless`
checks exactly that against HF `generate`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workers.stages.evaluate.target import TargetRunner


@dataclass
class Decoded:
    tokens: list[int]
    seconds: float
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per step
    anchors: list[int] = field(default_factory=list)   # position of each step's anchor token


def _finish(tokens: list[int], max_new: int, eos: set[int]) -> list[int]:
    out = tokens[:max_new]
    for i, t in enumerate(out):
        if t in eos:
            return out[:i + 1]
    return out


def speculative_greedy(runner: TargetRunner, proposer: Any, prompt: list[int], max_new: int,
                       eos: set[int]) -> Decoded:
    t0 = time.perf_counter()
    runner.new_cache()
    proposer.reset()
    first = runner.forward(prompt, last_logits_only=True)
    proposer.extend(first.aux)
    seq = list(prompt) + [int(first.logits[0, -1].argmax())]
    new = 1
    accepted: list[int] = []
    anchors: list[int] = []
    while new < max_new and seq[-1] not in eos:
        anchors.append(len(seq) - 1)
        draft = proposer.propose(seq)
        # step.greedy(i): the target's token after slot i. The head runs on every slot at
        # once after a step that accepted a draft, else first on the anchor's slot alone.
        step = runner.verify([seq[-1]] + draft, every_slot=bool(accepted and accepted[-1]))
        commit: list[int] = []
        for i, d in enumerate(draft):
            if d != step.greedy(i):
                break
            commit.append(d)
            if d in eos:
                break
        n_acc = len(commit)
        if not (commit and commit[-1] in eos):
            commit.append(step.greedy(n_acc))  # the bonus token
        accepted.append(n_acc)
        # The cache now holds anchor + K drafts; keep anchor + accepted drafts.
        runner.rollback(len(draft) - n_acc)
        # A proposer that reads no hidden states (prompt lookup) runs without any.
        proposer.extend(None if step.aux is None else step.aux[:, :n_acc + 1])
        seq.extend(commit)
        new += len(commit)
    out = _finish(seq[len(prompt):], max_new, eos)
    return Decoded(out, time.perf_counter() - t0, accepted, anchors)


def plain_greedy(runner: TargetRunner, prompt: list[int], max_new: int, eos: set[int]) -> Decoded:
    """The target alone, one token per forward on the same cache code: the speed baseline."""
    t0 = time.perf_counter()
    runner.new_cache()
    step = runner.forward(prompt, with_hidden=False, last_logits_only=True)
    out = [int(step.logits[0, -1].argmax())]
    while len(out) < max_new and out[-1] not in eos:
        step = runner.forward([out[-1]], with_hidden=False)
        out.append(int(step.logits[0, -1].argmax()))
    return Decoded(_finish(out, max_new, eos), time.perf_counter() - t0)


def hf_greedy(model: Any, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """HF `generate` greedy output: the reference the lossless check compares against."""
    import torch

    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new, eos_token_id=sorted(eos) or None,
                             pad_token_id=next(iter(sorted(eos)), 0), top_p=None, top_k=None,
                             temperature=None)
    return _finish(out[0, len(prompt):].tolist(), max_new, eos)


def tau_by_source(sources: list[str], accepted: dict[str, list[list[int]]]) -> dict:
    """tau per source dataset of a mixed evaluation set: `accepted[who][i]` is the accepted
    draft counts of prompt i's steps (who: "tau", "tau_baseline", ...), `sources[i]` its
    dataset. A source's tau is over its own steps, as the overall tau is over all of them."""
    out: dict[str, dict] = {}
    for name in sorted(set(sources)):
        idx = [i for i, s in enumerate(sources) if s == name]
        row: dict = {"prompts": len(idx)}
        for who, per_prompt in accepted.items():
            steps = [a for i in idx for a in per_prompt[i]]
            row[who] = 1.0 + sum(steps) / len(steps) if steps else None
            if who == "tau":
                row["steps"] = len(steps)
        out[name] = row
    return out


def acceptance_stats(accepted: list[int], num_spec: int) -> dict:
    """tau, per-position acceptance rates and the histogram of accepted lengths.

    Per-position rate k (1-based) is the share of steps whose first k drafts were all
    accepted, as vLLM's `spec_decode_num_accepted_tokens_per_pos / num_drafts`; so
    tau = 1 + sum of the rates.
    """
    steps = len(accepted)
    if steps == 0:
        return {"tau": None, "steps": 0, "acceptance_rate_per_position": [],
                "histogram": {}, "draft_acceptance_rate": None}
    hist = Counter(a + 1 for a in accepted)  # accepted length incl. bonus
    rates = [sum(1 for a in accepted if a >= k) / steps for k in range(1, num_spec + 1)]
    return {
        "tau": 1.0 + sum(accepted) / steps,
        "steps": steps,
        "acceptance_rate_per_position": rates,
        "histogram": {str(n): hist.get(n, 0) for n in range(1, num_spec + 2)},
        "draft_acceptance_rate": sum(accepted) / (steps * num_spec),
    }
