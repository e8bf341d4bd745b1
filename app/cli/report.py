"""`draftyard runs show RUN_ID`: the run report (GET /v1/runs/{id}/report, built by
app/runs/report.py) in a terminal, in the order people read it: the verdict first, tau
trained vs untrained, acceptance per position, the training curves, the serve command,
and where every artifact came from."""

from __future__ import annotations


from app.cli.view import console, duration, human_size, make_table, num

VERDICT_COLOR = {"accept": "green", "reject": "red"}
# Acceptance-like training series, as the trainer names them: the first present is shown.
ACC_SERIES = ("acc_1", "full_acc", "val_acc_1")


def ascii_chart(points: list[list[float]], width: int = 56, height: int = 7,
                x_label: str = "step", y_label: str = "") -> list[str]:
    """A line chart in text with a labelled y axis (min, max) and x axis (first, last)."""
    pts = [(float(x if x is not None else i), float(y)) for i, (x, y) in enumerate(points)]
    if not pts:
        return []
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    grid = [[" "] * width for _ in range(height)]
    for x, y in pts:
        c = round((x - x0) / ((x1 - x0) or 1) * (width - 1))
        r = height - 1 - round((y - y0) / ((y1 - y0) or 1) * (height - 1))
        grid[r][c] = "•"
    lab = [f"{y1:.3g}", f"{y0:.3g}"]
    w = max(len(s) for s in lab)
    out = [f"  {y_label}"] if y_label else []
    for i, row in enumerate(grid):
        tick = lab[0] if i == 0 else lab[1] if i == height - 1 else ""
        out.append(f"  {tick:>{w}} ┤{''.join(row)}")
    out.append(f"  {'':>{w}} └{'─' * width}")
    left, right = f"{x0:g}", f"{x1:g} {x_label}"
    out.append(f"  {'':>{w}}  {left}{right:>{width - len(left)}}")
    return out


def bar_rows(rates: dict[str, list[float]], width: int = 40) -> list[str]:
    """Acceptance per position as horizontal bars: y axis draft position k, x axis 0-100 %."""
    names = [n for n in ("trained", "untrained", "prompt_lookup", "vllm")
             if n in rates] or list(rates)
    if not names:
        return []
    out = [f"  k  {'':<13} 0%{'':{width - 6}}100%"]
    for k in range(max(len(rates[n]) for n in names)):
        for i, n in enumerate(names):
            if k >= len(rates[n]):
                continue
            v = max(0.0, min(1.0, rates[n][k]))
            bar = ("█" if n == "trained" else "▒") * round(v * width)
            pos = f"{k + 1:>3}" if i == 0 else "   "
            out.append(f"  {pos} {n:<13}│{bar:<{width}} {100 * v:5.1f}%")
    out.append(f"  {'':>17}└{'─' * width}  P(first k drafts accepted)")
    return out


def eval_data(d: dict) -> str:
    """The evaluation data by its dataset's name when it is one (with the ids)."""
    ds = d.get("dataset")
    if ds:
        return f"{ds.get('name')} ({ds.get('id')}, artifact {d.get('artifact_id')})"
    made = d.get("made_from")
    return f"artifact {d.get('artifact_id')} ({d.get('kind')})" + (
        f", made from {made.get('name')} ({made.get('id')})" if made else "")


def stage_how(s: dict) -> str:
    """How a stage got its outputs: by an attempt of its own, or reused from an earlier job
    that did the same work (app/scheduler/service.py _reuse)."""
    if s.get("reused_from"):
        return f"reused from {s['reused_from']}"
    return f"attempt {s['attempt']}"


def compare_table(rows: list[dict]):
    """The drafters of one run, best tau first (app/runs/compare.py), on one evaluation."""
    def opts(r: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in (r.get("options") or {}).items()
                        if v is not None and k != "mask_token_id")

    def accept(r: dict) -> str:
        rates = r.get("acceptance_per_position") or []
        return " ".join(f"{100 * x:.0f}" for x in rates) + ("%" if rates else "-")

    def size(r: dict) -> str:
        p = r.get("drafter_parameters")
        return (human_size(r["drafter_bytes"]) if r.get("drafter_bytes") else "-") + (
            f" ({p / 1e6:.2f}M params)" if isinstance(p, int) else "")

    def took(r: dict) -> str:
        if r.get("train_reused_from"):
            return f"reused ({r['train_reused_from']})"
        t = r.get("train_seconds")
        return duration(t) if isinstance(t, (int, float)) else "-"

    return make_table(
        "drafters ranked by tau on the same evaluation",
        ("#", "drafter", "type", "options", "tau", "untrained", "prompt lookup",
         "accepted per position", "train time", "size", "verdict"),
        [[str(r["rank"]), r["name"], r.get("type") or "-", opts(r) or "-", num(r.get("tau")),
          num(r.get("tau_baseline")), num(r.get("tau_prompt_lookup")), accept(r), took(r),
          size(r), str(r.get("verdict") or (r.get("status") or {}).get("evaluate") or "-")]
         for r in rows])


def print_report(rep: dict, log=console.print) -> None:
    run, ev = rep["run"], rep.get("evaluation") or {}
    verdict = ev.get("verdict")
    color = VERDICT_COLOR.get(str(verdict), "yellow")
    log(f"[bold]run {run['name']}[/bold] {run['id']}  owner {run['owner'].get('name') or '?'}  "
        f"status {run['status']}")
    if rep.get("drafters"):  # several drafters: the ranking, then the best one in detail
        log(compare_table(rep["drafters"]))
        for r in rep["drafters"]:
            if r.get("verdict_reason"):
                log(f"  {r['name']}: {r['verdict']} — {r['verdict_reason']}")
        log(f"\n[bold]best: {rep['drafters'][0]['name']}[/bold] (below: its evaluation)")
    if verdict:
        log(f"[bold {color}]VERDICT: {str(verdict).upper()}[/]"
            + (f" — {ev['verdict_reason']}" if ev.get("verdict_reason") else ""))
    else:
        log("[yellow]VERDICT: none yet[/] (no evaluate stage has finished)")
    if ev.get("tau") is not None or ev.get("tau_baseline") is not None:
        log(f"tau (tokens per target forward): trained [bold]{num(ev.get('tau'))}[/bold] vs "
            f"untrained {num(ev.get('tau_baseline'))} vs prompt lookup "
            f"{num(ev.get('tau_prompt_lookup'))}"
            + (f"   (simulated {num(ev.get('tau_sim'))} vs {num(ev.get('tau_sim_baseline'))})"
               if ev.get("tau_sim") is not None else ""))
    if ev.get("evaluated_on"):
        log(f"evaluated on: {ev['evaluated_on']}")
    if ev.get("data"):
        log(f"evaluation data: {eval_data(ev['data'])}")
    if ev.get("by_source"):
        log(make_table("tau by source (the evaluation set mixes datasets)",
                       ("source", "prompts", "tau trained", "tau untrained"),
                       [[name, str(s.get("prompts")), num(s.get("tau")),
                         num(s.get("tau_baseline"))] for name, s in ev["by_source"].items()]))
    for k in ("oov_share", "oov_reference_share"):
        if ev.get(k) is not None:
            log(f"reference tokens outside the draft vocabulary: {100 * ev[k]:.1f}%")
    log(f"target {rep['target'].get('name') or '-'} ({rep['target'].get('id')}), "
        f"data {rep['dataset'].get('name') or '-'} ({rep['dataset'].get('id')})")
    wide = max([9, *(len(s["stage"]) for s in rep["stages"])])  # keys: `train:<drafter>`
    for s in rep["stages"]:
        err = f"  {s['error'].get('code')}: {s['error'].get('message')}" if s.get("error") else ""
        log(f"  {s['stage']:<{wide}} {s['job_id']} {s['status']:<10} {stage_how(s)}{err}")
    if rep.get("per_position"):
        log("\n[bold]acceptance per draft position[/bold] (greedy speculative decoding)")
        for line in bar_rows(rep["per_position"]):
            log(line, markup=False, highlight=False)
    series = (rep.get("curves") or {}).get("series") or {}
    acc = next((a for a in ACC_SERIES if len(series.get(a) or []) > 1), None)
    for name, unit in (("loss", "training loss (cross-entropy, nats)"),
                       (acc, f"training acceptance {acc} (fraction of positions, teacher-forced)")):
        if name and len(series.get(name) or []) > 1:
            log(f"\n[bold]{unit}[/bold]")
            for line in ascii_chart(series[name], x_label="step"):
                log(line, markup=False, highlight=False)
    for p in rep.get("plots") or []:
        log(f"\nevaluate plot: {p['url']} (or `draftyard artifacts pull {p['artifact_id']} DIR`)")
    d = rep.get("drafter")
    if d:
        log(f"\ndrafter {d['artifact_id']}: {d.get('steps')} steps, final loss "
            f"{num(d.get('final_loss'))}")
        if d.get("serve_command"):
            log("serve it:")
            log(f"  {d['serve_command']}", markup=False, highlight=False, soft_wrap=True)
    if rep.get("lineage"):
        log(make_table("lineage of every artifact", (
            "artifact", "kind", "stage", "from", "dataset", "template sha256", "target"),
            [[a["id"], a["kind"], a.get("stage") or "", ", ".join(a["inputs"]) or "-",
              a["dataset"].get("name") or a["dataset"].get("id") or "-",
              (a.get("chat_template_sha256") or "-")[:12],
              a["target"].get("name") or a["target"].get("id") or "-"]
             for a in rep["lineage"]]))
