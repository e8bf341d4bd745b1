"""The eval report on disk: `report.json` and `acceptance.png` (per-position acceptance)."""

from __future__ import annotations

from pathlib import Path

from workers.stages.common import write_json_atomic

REPORT_FILE = "report.json"
PLOT_FILE = "acceptance.png"


def _series(report: dict) -> list[tuple[str, list[float], str]]:
    """(label, per-position rates, style) for every measure present, drafter then baseline."""
    out = []
    for who, rep in (("drafter", report), ("baseline", report.get("baseline") or {})):
        if rep.get("acceptance_rate_per_position"):
            out.append((f"{who}: greedy spec decode (tau {rep['tau']:.2f})",
                        rep["acceptance_rate_per_position"], "bar"))
        if rep.get("acceptance_rate_per_position_sim"):
            out.append((f"{who}: simulated (tau_sim {rep['tau_sim']:.2f})",
                        rep["acceptance_rate_per_position_sim"], "line"))
    pl = report.get("prompt_lookup") or {}
    if pl.get("acceptance_rate_per_position"):
        out.append((f"prompt lookup: greedy spec decode (tau {pl['tau']:.2f})",
                    pl["acceptance_rate_per_position"], "bar"))
    vl = report.get("vllm") or {}
    if vl.get("acceptance_rate_per_position"):
        out.append((f"drafter: vLLM (tau {vl['tau']:.2f})", vl["acceptance_rate_per_position"],
                    "line"))
    return out


def plot_acceptance(report: dict, path: Path) -> None:
    """Bars for real acceptance per position, lines for simulated and vLLM, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(report)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    bars = [s for s in series if s[2] == "bar"]
    width = 0.8 / max(1, len(bars))
    for i, (label, rates, _) in enumerate(bars):
        xs = [k + 1 + (i - (len(bars) - 1) / 2) * width for k in range(len(rates))]
        ax.bar(xs, rates, width=width, label=label)
    for label, rates, _ in (s for s in series if s[2] == "line"):
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(first k drafts accepted)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Acceptance per position — verdict: {report.get('verdict')}")
    if series:
        ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(folder: Path, report: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / REPORT_FILE, report)
    plot_acceptance(report, folder / PLOT_FILE)
    return folder
