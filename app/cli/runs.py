"""CLI commands for whole runs and datasets: `plan`, `run`, `runs`, `runs show`, `dataset`.

    draftyard dataset data/orca.jsonl --name orca        # upload, wait, print stats + rejects
    draftyard plan run.json                              # checks in seconds; exit 1 on errors
    draftyard run run.json --follow                      # submit, per-stage bars, the report
    draftyard runs [--json]
    draftyard runs show RUN_ID                           # the report people read
    draftyard runs cancel RUN                            # by id or name

`run.json` is the body of `POST /v1/runs` (docs/API.md); `app/cli/demo.py` builds a complete one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from app.cli.report import print_report
from app.cli.view import (TERMINAL, console, fail, follow_jobs, hanging, help_later, human_size,
                          make_table, num,
                          owner_names,
                          print_error,
                          print_failures,
                          print_json, verdict_line)
from draftyard import ApiError, Client


def _body(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        print_error(f"{path}: no such file")
    except json.JSONDecodeError as e:
        print_error(f"{path}: not JSON (line {e.lineno}, column {e.colno}: "
                      f"{e.msg})")
    raise typer.Exit(2)


def print_plan(plan: dict, seconds: float | None = None, log=console.print) -> None:
    took = f" ({seconds:.1f} s)" if seconds is not None else ""
    log(f"plan{took}: {'[green]ok[/green]' if plan['ok'] else '[red]has errors[/red]'}")
    for ch in plan["checks"]:
        log(hanging(f"  {'ok ' if ch['ok'] else 'ERR'}", f"{ch['name']}: {ch['message']}",
                    "green" if ch["ok"] else "red"))
    for f in (plan.get("failures") or [])[:10]:
        log(hanging("  record", f"{f.get('id', '?')} ({f.get('source', '?')}): "
                                f"{f.get('reason', '')}"))
    more = len(plan.get("failures") or []) - 10
    if more > 0:
        log(f"  ... and {more} more records")
    for w in plan.get("warnings") or []:
        log(hanging("  warning", w, "yellow"))
    print_time_estimates(plan.get("time_estimates") or {}, log)


def gpu_hours(h: float) -> str:
    return "0" if not h else "<0.001" if h < 0.001 else f"{h:.3f}" if h < 100 else f"{h:,.0f}"


def duration(hours: float) -> str:
    s = hours * 3600
    return (f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else
            f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days")


def print_time_estimates(est: dict, log=console.print) -> None:
    """The plan's time estimates (workers/stages/plan_time.py): per stage GPUs, GPU-hours and
    wall time, what each rests on, the total, and where the rates came from."""
    if not est.get("stages"):
        return
    rates = est.get("rates") or {}
    mine = est.get("rates_from_deployment") or []
    source = (f"this server's DRAFTYARD_PLAN_RATES ({', '.join(mine)}), the rest defaults"
              if mine else "the defaults (the server's DRAFTYARD_PLAN_RATES overrides them)")
    log(f"time estimates for {rates.get('gpu') or 'the default GPU'}", markup=False)
    log(f"  rates: {source}", markup=False)
    from rich.padding import Padding
    from rich.text import Text

    for st in est["stages"]:
        gpus = f"{st['gpus']} GPU" + ("s" if st["gpus"] != 1 else "") if st["gpus"] else "CPU"
        log(f"  {st['stage']:<9} {gpus:<7} {gpu_hours(st['gpu_hours']):>9} GPU-h  "
            f"{duration(st['wall_hours']):>9} wall", markup=False)
        # what the number rests on, under it (wrapped there, not at the margin)
        log(Padding(Text(st.get("basis") or "", style="dim"), (0, 0, 0, 12)))
    log(f"  {'total':<17} {gpu_hours(est.get('total_gpu_hours') or 0):>9} GPU-h  "
        f"{duration(est.get('total_wall_hours') or 0):>9} wall, "
        f"{human_size(est.get('total_disk_bytes') or 0)} written", markup=False)



def print_run_report(c: Client, run: dict) -> None:
    color = {"succeeded": "green", "failed": "red"}.get(run["status"], "yellow")
    console.print(f"\nrun {run['id']}: [{color}]{run['status']}[/{color}]")
    rep = run.get("report") or {}
    for d in rep.get("drafters") or []:  # several drafters (best tau first)
        console.print(f"[bold]{d.get('drafter')}[/bold]: {verdict_line(d)}")
    if rep and not rep.get("drafters"):  # the pipeline may have worked with a rejected drafter
        console.print(verdict_line(rep))
    for j in run["jobs"]:
        extra = f"  {j['error']['code']}: {j['error']['message']}" if j.get("error") else ""
        reused = f" (reused {j['reused_from']})" if j.get("reused_from") else ""
        console.print(f"  {j['run_stage']:<9} {j['id']} {j['status']:<10}"
                      f"{', '.join(j['outputs']) or '-'}{reused}{extra}")
        print_failures(j, indent="      ")
    console.print(f"  the whole report: draftyard runs show {run['id']}")


def plan(file: Path = typer.Argument(..., help="a run body (JSON), as for POST /v1/runs"),
         json_out: bool = typer.Option(False, "--json", help="the API's answer as it came")):
    """Dry-run a run on a sample of its data, without GPUs: checks, time estimates per
    stage (GPU-hours, wall time); exit 1 when a check fails."""
    c = Client(timeout=180)
    t = time.time()
    try:
        p = c.plan(_body(file))
    except ApiError as e:
        fail(e, 2)
    if json_out:
        print_json(p)
    else:
        print_plan(p, time.time() - t)
    raise typer.Exit(0 if p["ok"] else 1)


def run(file: Path = typer.Argument(..., help="a run body (JSON), as for POST /v1/runs"),
        follow: bool = typer.Option(False, "-f", "--follow", help="per-stage progress bars"),
        force_plan: bool = typer.Option(False, help="start even if the plan has errors")):
    """Submit a whole run (generate -> prepare -> extract -> train -> evaluate)."""
    c = Client(timeout=180)
    body = _body(file)
    if force_plan:
        body["force_plan"] = True
    try:
        r = c.create_run(body)
    except ApiError as e:
        if e.code == "plan_failed":
            print_plan(e.details)
            console.print("[red]refused[/red]: the plan has errors (--force-plan to start "
                          "anyway)")
            raise typer.Exit(1) from None
        fail(e, 2)
    console.print(f"submitted run [bold]{r['id']}[/bold]: "
                  f"{' -> '.join(j['run_stage'] for j in r['jobs'])}")
    if not follow:
        return
    labels = {j["id"]: j["run_stage"] for j in r["jobs"]}
    follow_jobs(c, list(labels), labels)
    final = c.get_run(r["id"])
    for _ in range(20):  # the run's own status follows its jobs' within a moment
        if final["status"] in TERMINAL:
            break
        time.sleep(0.5)
        final = c.get_run(r["id"])
    print_run_report(c, final)
    raise typer.Exit(0 if final["status"] == "succeeded" else 1)


def runs(ctx: typer.Context, limit: int = 20,
         json_out: bool = typer.Option(False, "--json", help="the API's JSON")):
    """List runs with their stages and acceptance."""
    if ctx.invoked_subcommand is not None:
        return
    c = Client()
    try:
        page = c.list_runs(limit=limit)
        if json_out:
            return print_json(page["data"])
        names = owner_names(c)
    except ApiError as e:
        fail(e)
    rows = []
    for r in page["data"]:
        stages = " ".join(f"{j['run_stage']}:{j['status']}" for j in r["jobs"])
        rep = r.get("report") or {}
        if rep.get("drafters"):  # several: the best one's (app/runs/service.py ranked)
            rep = rep["drafters"][0]
        tau = f"{num(rep.get('tau'))} ({num(rep.get('tau_baseline'))})" if rep else ""
        v = rep.get("verdict") or ""
        rows.append([f"[{'green' if v == 'accept' else 'red'}]{v}[/]" if v else "", r["id"],
                     r["name"], names.get(r["owner"], r["owner"]), r["status"], stages, tau])
    console.print(make_table("runs", ("verdict", "id", "name", "owner", "status", "stages",
                                      "tau (untrained)"), rows))


def runs_cancel(run: str = typer.Argument(..., help="a run's id or name"),
                json_out: bool = typer.Option(False, "--json", help="the run's JSON")):
    """Cancel every unfinished stage of a run (finished stages keep their artifacts)."""
    try:
        r = Client().cancel_run(run)
    except ApiError as e:
        fail(e)
    if json_out:
        return print_json(r)
    stopping = r["status"] not in TERMINAL and any(j["status"] == "cancelling"
                                                   for j in r["jobs"])
    console.print(f"run {r['id']} ({r['name']}): {r['status']}" +
                  (" (its running stage is stopping)" if stopping else ""), markup=False)
    for j in r["jobs"]:
        console.print(f"  {j['run_stage']:<9} {j['id']} {j['status']}", markup=False)


def runs_show(run_id: str, json_out: bool = typer.Option(False, "--json",
                                                         help="the report's JSON")):
    """One run's report: verdict first, tau trained vs untrained, acceptance per
    position, training curves, the serve command, and where every artifact came from."""
    c = Client()
    try:
        rep = c.run_report(run_id)
    except ApiError as e:
        fail(e)
    if json_out:
        return print_json(rep)
    print_report(rep)


def dataset(file: Path = typer.Argument(..., help="a chat-data file to upload"),
            name: Optional[str] = typer.Option(None, help="default: the file's name"),
            fmt: str = typer.Option("auto", "--format", help="force a format (listed "
                                    "above; auto: detect it)"),
            server_path: bool = typer.Option(False, help="ingest FILE where it lies on the "
                                             "server (inside DRAFTYARD_DATA_ROOTS), no upload")):
    """Add a dataset and wait for its ingest: format, counts, rejected lines and why."""
    c = Client(timeout=600)
    name = name or file.name.split(".")[0]
    try:
        if server_path:
            d = c.add_dataset(name, file.resolve(), fmt)
        else:
            if not file.is_file():
                print_error(f"{file}: no such file")
                raise typer.Exit(2)
            d = c.upload_dataset(file, name, fmt)
        console.print(f"dataset [bold]{d['id']}[/bold] ({d['status']})")
        d = c.wait_dataset(d["id"], timeout=None, poll=0.5)
    except ApiError as e:
        fail(e)
    if d["status"] != "ready":
        console.print(f"[red]{d['status']}[/red]: {(d.get('error') or {}).get('message', '')}")
        raise typer.Exit(1)
    st = d.get("stats") or {}
    console.print(f"{d['name']}: format {d['format']}, {d['num_records']} records "
                  f"({st.get('user_only', 0)} prompt-only, {st.get('with_system', 0)} with "
                  f"system, {st.get('with_tools', 0)} with tools), "
                  f"{d['num_rejected']} rejected")
    for rj in d.get("rejected_sample") or []:
        console.print(f"  line {rj['line']}: {rj['reason']}")


def _dataset_help() -> str:
    """dataset's help with the formats (contracts/ingest.py)."""
    from contracts.ingest import FORMATS

    return f"{dataset.__doc__}\n\n\b\nformats: {' | '.join(FORMATS)}"


def register(cli: typer.Typer) -> None:
    cli.command()(plan)
    cli.command()(run)
    runs_app = typer.Typer(help="List runs; `runs show RUN_ID` for one run's report.")
    cli.add_typer(runs_app, name="runs")
    runs_app.callback(invoke_without_command=True)(runs)
    runs_app.command("cancel")(runs_cancel)
    runs_app.command("show")(runs_show)
    cli.command(cls=help_later(_dataset_help))(dataset)
