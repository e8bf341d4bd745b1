"""Simulated acceptance from teacher-forced per-position accuracy: cheap, no decoding loop.

For every anchor position p of a held-out row (a response token with K tokens of target
prediction after it), the drafter proposes K tokens from the row's true prefix, and each is
compared with the target's own greedy token at that position (from one forward of the target
over the row, full vocabulary). Two estimates follow:

- `tau_sim = 1 + sum_k prod_{j<=k} acc_j` from the per-position accuracies acc_j (the
  formula the issue asks for; it treats positions as independent);
- `tau_sim_joint = 1 + sum_k P(first k all correct)`, counted per block. For EAGLE-3 this is
  speculators' `full_acc_k` (already joint: tau = 1 + sum_k full_acc_k).

Both overstate real greedy acceptance on a loopy target, where real decoding revisits the
contexts the drafter finds hard (docs/FIELD-NOTES.md "Measuring acceptance": 4.4 vs 3.0); the report
keeps real greedy speculative decoding as ground truth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workers.stages.evaluate.target import TargetRunner


def tau_from_position_acc(acc: Sequence[float], joint: bool = False) -> float:
    """1 + sum_k prod_{j<=k} acc_j; with `joint=True` the accuracies are already joint."""
    total, run = 1.0, 1.0
    for a in acc:
        run = a if joint else run * a
        total += run
    return total


def teacher_forced_acceptance(runner: TargetRunner, proposer: Any,
                              rows: Sequence[tuple[list[int], list[int]]],
                              chunk: int = 64,
                              on_row: Callable[[int], None] | None = None,
                              runs_at: Sequence[Sequence[int]] | None = None) -> dict:
    """Per-position accuracies and both tau estimates over `rows` of (input_ids, loss_mask).

    `runs_at[i]` lists anchor positions of row i whose accepted-run length (leading correct
    drafts) to return in `runs` (a list of {anchor: run} per row): the anchors that real
    speculative decoding visited, so the two can be compared step by step.
    """
    import torch

    k = proposer.num_spec
    correct_blocks = []
    runs: list[dict[int, int]] = []
    for n, (ids, mask) in enumerate(rows):
        row_runs: dict[int, int] = {}
        runs.append(row_runs)
        t = len(ids)
        anchors = [p for p in range(1, t - k + 1) if mask[p]]
        if anchors:
            step = runner.full_forward(ids)
            greedy = step.logits[0].argmax(-1)  # shape: [T]; greedy[p]: target token at p+1
            dev = greedy.device
            ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
            anc = torch.tensor(anchors, dtype=torch.long, device=dev)
            for i in range(0, len(anchors), chunk):
                a = anc[i:i + chunk]
                pred = proposer.teacher_forced(step.aux, ids_t, a)  # shape: [A, K]
                truth = greedy[a[:, None] + torch.arange(k, device=dev)[None, :]]  # [A, K]
                correct = (pred == truth).cpu()
                correct_blocks.append(correct)
                if runs_at is not None:
                    want = set(runs_at[n])
                    run_len = correct.long().cumprod(dim=1).sum(dim=1).tolist()
                    for p, r in zip(a.tolist(), run_len, strict=True):
                        if p in want:
                            row_runs[p] = int(r)
        if on_row is not None:
            on_row(n + 1)
    if not correct_blocks:
        return {"tau_sim": None, "tau_sim_joint": None, "blocks": 0, "runs": runs,
                "accuracy_per_position": [], "acceptance_rate_per_position_sim": []}
    correct = torch.cat(correct_blocks).float()  # shape: [blocks, K]
    acc = correct.mean(0).tolist()
    joint = correct.cumprod(dim=1).mean(0).tolist()
    rates = []
    run = 1.0
    for a in acc:
        run *= a
        rates.append(run)
    return {
        "tau_sim": tau_from_position_acc(acc),
        "tau_sim_joint": tau_from_position_acc(joint, joint=True),
        "blocks": int(correct.shape[0]),
        "accuracy_per_position": acc,
        "acceptance_rate_per_position_sim": rates,
        "joint_acceptance_per_position_sim": joint,
        "runs": runs,
    }
