"""`draftyard`: run the service (up, server, worker) and talk to it (submit, jobs, show, logs,
cancel, retry, queue, nodes; runs, datasets, targets, artifacts, users, webhooks in
`runs.py` and `resources.py`). Every HTTP call goes through the Python client
(`draftyard.Client`); every listing takes `--json`."""

from __future__ import annotations

import json
import os
import sys

from typing import Optional

import typer

from app.cli import initrun as _initrun
from app.cli import resources as _resources
from app.cli import runs as _runs
from app.cli import storage as _storage
from app.cli.view import (console, describe, fail, follow_jobs, help_later, jobs_table,
                          owner_names, print_error,
                          print_failures,
                          print_json)
from draftyard import ApiError, Client

cli = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="draftyard: train speculative-decoding drafters as a shared service")


def _client() -> Client:
    return Client()


# ---- running the service ------------------------------------------------------------------

@cli.command()
def up(host: str = "127.0.0.1", port: int = 8000,
       gpus: Optional[str] = typer.Option(None, help="declare GPUs for the embedded worker")):
    """Embedded mode: API and one worker, SQLite and a serverless broker under $DRAFTYARD_HOME."""
    from app.cli.serve import run_embedded

    run_embedded(host, port, gpus)


@cli.command()
def server(host: str = "0.0.0.0", port: int = 8000, workers: int = 1,
           migrate: bool = typer.Option(False, help="apply migrations before starting")):
    """Production API (PostgreSQL + Redis named by DRAFTYARD_DATABASE_URL / BROKER_URL)."""
    from app.cli.serve import run_server

    run_server(host, port, workers, migrate)


@cli.command()
def worker(node: str = typer.Option("local", help="this box's node name"),
           gpus: Optional[str] = typer.Option(None, help="declare GPU indices, e.g. 0,1,2,3"),
           concurrency: Optional[int] = None):
    """One worker per GPU box (runs `python -m workers`)."""
    argv = [sys.executable, "-m", "workers", "--node", node]
    if gpus is not None:
        argv += ["--gpus", gpus]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    os.execv(sys.executable, argv)


@cli.command()
def migrate():
    """Apply database migrations."""
    from app.core.config import get_settings
    from app.core.migrate import upgrade_head

    upgrade_head(get_settings().db_url)
    console.print("migrations applied")


@cli.command()
def demo(json_out: bool = typer.Option(False, "--json", help="end with a JSON summary line"),
         quick: bool = typer.Option(False, help="a shorter variant (tests)"),
         keep: bool = typer.Option(False, help="keep the service running afterwards")):
    """The whole pipeline on a tiny target, end to end, through the HTTP API."""
    from app.cli.demo import run_demo

    raise typer.Exit(run_demo(json_out=json_out, quick=quick, keep=keep))


@cli.command("real-target")
def real_target(register: bool = typer.Option(
                    False, help="register the target (and upload the prompt files) with the "
                                "server DRAFTYARD_URL names"),
                prompts: Optional[str] = typer.Option(
                    None, help="also write ShareGPT and HumanEval prompt files (JSONL) here"),
                name: str = typer.Option("smollm2-135m-instruct", help="the target's name"),
                json_out: bool = typer.Option(False, "--json", help="end with a JSON line")):
    """A real pretrained chat target (SmolLM2-135M-Instruct) and real prompts, prepared once
    per machine in $DRAFTYARD_CACHE; see workers/stages/real_target.py."""
    from pathlib import Path

    from app.cli.real_target import prepare
    from app.cli.real_target import register as register_target

    try:
        folder, counts = prepare(Path(prompts) if prompts else None)
    except RuntimeError as e:
        print_error(str(e))
        raise typer.Exit(1) from e
    out: dict = {"path": str(folder), "prompts": counts}
    if register:
        try:
            out.update(register_target(_client(), folder, counts, name))
        except ApiError as e:
            fail(e)
    if json_out:
        print(json.dumps(out))


# ---- client commands ----------------------------------------------------------------------

def _submit_help() -> str:
    """Every job type with its one line (contracts/jobtypes.py); \b keeps click from
    rewrapping."""
    from contracts.jobtypes import JOB_TYPES

    return "Submit a job.\n\n\b\n" + "\n".join(
        f"{n:<9} {d.summary}" for n, d in JOB_TYPES.items())


@cli.command(cls=help_later(_submit_help))
def submit(type: str = typer.Argument(..., help="a job type (listed above)"),  # noqa: A002
           params: str = typer.Option("{}", help="JSON params"),
           inputs: str = typer.Option("{}", help="JSON inputs"),
           gpus: int = 0, priority: int = 50, name: Optional[str] = None,
           follow: bool = typer.Option(False, "-f", "--follow", help="show a live progress bar")):
    c = _client()
    try:
        body = {"type": type, "params": json.loads(params), "inputs": json.loads(inputs),
                "gpus": gpus, "priority": priority}
    except json.JSONDecodeError as e:
        print_error(f"--params/--inputs is not JSON: {e}")
        raise typer.Exit(2) from e
    if name:
        body["name"] = name
    try:
        job = c.submit_job(**body)
    except ApiError as e:
        fail(e)
    console.print(f"submitted [bold]{job['id']}[/bold] ({job['status']})")
    if follow:
        final = follow_jobs(c, [job["id"]])[0]
        _print_final(final)


def _print_final(job: dict) -> None:
    color = {"succeeded": "green", "failed": "red"}.get(job["status"], "yellow")
    console.print(f"{job['id']}: [{color}]{job['status']}[/{color}]")
    if job.get("error"):
        console.print(f"  {job['error'].get('code')}: {job['error'].get('message')}")
    print_failures(job)
    if job.get("outputs"):
        console.print(f"  outputs: {', '.join(job['outputs'])}")


@cli.command()
def jobs(status: Optional[str] = None, type: Optional[str] = None, owner: Optional[str] = None,  # noqa: A002
         limit: int = 20, json_out: bool = typer.Option(False, "--json", help="the API's JSON")):
    """List jobs."""
    c = _client()
    try:
        page = c.list_jobs(status=status, type=type, owner=owner, limit=limit)
        if json_out:
            return print_json(page["data"])
        console.print(jobs_table(page["data"], names=owner_names(c)))
    except ApiError as e:
        fail(e)


@cli.command()
def show(job_id: str):
    """Show one job as JSON."""
    try:
        console.print_json(json.dumps(_client().get_job(job_id), default=str))
    except ApiError as e:
        fail(e)


@cli.command()
def logs(job_id: str, follow: bool = typer.Option(False, "-f", "--follow"),
         tail: Optional[int] = None):
    """Print (or follow) a job's log."""
    c = _client()
    try:
        if follow:
            for chunk in c.follow_logs(job_id, tail):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        else:
            sys.stdout.write(c.logs(job_id, tail))
    except ApiError as e:
        fail(e)


def _job_action(job_id: str, action: str) -> None:
    try:
        _print_final(_client().post(f"/v1/jobs/{job_id}/{action}"))
    except ApiError as e:
        fail(e)


@cli.command()
def cancel(job_id: str):
    """Cancel a job."""
    _job_action(job_id, "cancel")


@cli.command()
def retry(job_id: str):
    """Retry a failed or cancelled job (resumes from its checkpoint where the stage has one)."""
    _job_action(job_id, "retry")


@cli.command()
def queue(json_out: bool = typer.Option(False, "--json", help="the API's JSON")):
    """The shared queue: running and waiting jobs, per-user usage."""
    c = _client()
    try:
        q = c.queue()
        if json_out:
            return print_json(q)
        names = owner_names(c)
    except ApiError as e:
        fail(e)
    console.print(jobs_table(q["running"], "running", names))
    console.print(jobs_table(q["waiting"], "waiting (in order)", names))
    for u in q["users"]:
        console.print(f"  {u['name'] or u['id']}: {u['gpus_held']} GPUs held, "
                      f"{u['gpu_hours_24h']:.2f} GPU-h in 24 h, {u['waiting']} waiting")


@cli.command()
def nodes(json_out: bool = typer.Option(False, "--json", help="the API's JSON")):
    """Worker nodes and their GPUs."""
    try:
        data = _client().nodes()
        if json_out:
            return print_json(data)
        for n in data:
            state = "alive" if n["alive"] else "lost"
            state += ", draining" if n["draining"] else ""
            console.print(f"[bold]{n['name']}[/bold] ({state}) last heartbeat {n['last_heartbeat']}")
            for g in n["gpus"]:
                console.print(f"  gpu {g['index']}: {g['name']} -> {g['job_id'] or 'free'}")
    except ApiError as e:
        fail(e)


_runs.register(cli)  # plan, run, runs (list, show), dataset
_resources.register(cli)  # targets, datasets, artifacts, users, webhooks
_initrun.register(cli)  # init-run
_storage.register(cli)  # storage, storage prune


def main() -> None:
    """The `draftyard` entry point: every failure is one line naming its cause, never a
    traceback (`--debug`, anywhere on the line, or DRAFTYARD_DEBUG=1 shows it)."""
    import httpx

    from draftyard import resolve_settings

    debug = "--debug" in sys.argv[1:] or os.environ.get("DRAFTYARD_DEBUG") == "1"
    if "--debug" in sys.argv[1:]:
        sys.argv.remove("--debug")
    try:
        cli()
    except httpx.TransportError as e:
        if debug:
            raise
        print_error(f"cannot reach the draftyard API at {resolve_settings()[0]}: {e} (is it "
                    "running? `draftyard up` starts one; DRAFTYARD_URL points elsewhere)")
        raise SystemExit(3) from None
    except ApiError as e:
        if debug:
            raise
        print_error(describe(e))
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as e:  # the last net: one line, the cause, no traceback
        if debug:
            raise
        print_error(f"{type(e).__name__}: {e} (run with --debug for the traceback)")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

