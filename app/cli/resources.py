"""CLI commands for the team's resources, each a listing (with `--json`) plus its actions:

    draftyard targets [--json]               draftyard targets add NAME PATH
    draftyard datasets [--json]              (upload: `draftyard dataset FILE`)
    draftyard artifacts [--kind K] [--json]  draftyard artifacts pull ART_ID DIR / rm ART_ID
    draftyard users [--json]                 draftyard users add NAME [--role admin]
    draftyard webhooks [--json]              draftyard webhooks add URL [--event E ...]
                                             draftyard webhooks rm ID / deliveries ID
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from app.cli.view import (console, fail, human_size, make_table, owner_names, print_json,
                          read_text_file)
from draftyard import ApiError, Client

JSON = typer.Option(False, "--json", help="the API's JSON")


def _table(title: str, cols: tuple[str, ...], rows: list[list]) -> None:
    console.print(make_table(title, cols, rows))


def _list(fetch: Callable[[Client], list[dict]], json_out: bool, title: str,
          cols: tuple[str, ...], row: Callable[[dict, dict[str, str]], list],
          owners: bool = False) -> None:
    """One listing: with `--json` the items as the API gave them, else a table of
    `row(item, names)`; `names` (user id -> name) is read only for a table with an owner
    column (`owners`)."""
    c = Client()
    try:
        data = fetch(c)
        names = owner_names(c) if owners and not json_out else {}
    except ApiError as e:
        fail(e)
        return  # not reached: fail() exits
    if json_out:
        print_json(data)
        return
    _table(title, cols, [row(x, names) for x in data])


def _group(cli: typer.Typer, name: str, help_: str) -> typer.Typer:
    app = typer.Typer(help=help_, no_args_is_help=False)
    cli.add_typer(app, name=name)
    return app


def targets_list(ctx: typer.Context, limit: int = 20, json_out: bool = JSON):
    if ctx.invoked_subcommand:
        return
    _list(lambda c: c.list_targets(limit)["data"], json_out, "targets",
          ("id", "name", "owner", "architecture", "layers", "hidden", "vocab", "template",
           "path"),
          lambda t, names: [t["id"], t["name"], names.get(t["owner"], t["owner"]),
                            t.get("architecture"), t.get("num_layers"), t.get("hidden_size"),
                            t.get("vocab_size"), "yes" if t.get("has_chat_template") else "no",
                            t["path"]], owners=True)


def targets_add(name: str, path: str = typer.Argument(..., help="a model folder on the "
                                                       "server, inside DRAFTYARD_MODEL_ROOTS"),
                chat_template: Optional[Path] = typer.Option(None, help="a .jinja file")):
    """Register a target model."""
    text = read_text_file(chat_template, "--chat-template") if chat_template else None
    try:
        t = Client().create_target(name, path, chat_template=text)
    except ApiError as e:
        fail(e)
    console.print(f"target [bold]{t['id']}[/bold]: {t['architecture']}, "
                  f"{t['num_layers']} layers, hidden {t['hidden_size']}")


def datasets_list(ctx: typer.Context, limit: int = 20, json_out: bool = JSON):
    if ctx.invoked_subcommand:
        return
    _list(lambda c: c.list_datasets(limit)["data"], json_out, "datasets",
          ("id", "name", "owner", "status", "format", "records", "rejected", "prompt-only"),
          lambda d, names: [d["id"], d["name"], names.get(d["owner"], d["owner"]),
                            d["status"], d.get("format"), d.get("num_records"),
                            d.get("num_rejected"), (d.get("stats") or {}).get("user_only")],
          owners=True)


def artifacts_list(ctx: typer.Context, kind: Optional[str] = None,
                   job_id: Optional[str] = None, limit: int = 20, json_out: bool = JSON):
    if ctx.invoked_subcommand:
        return
    _list(lambda c: c.list_artifacts(kind, job_id, limit)["data"], json_out, "artifacts",
          ("id", "kind", "size", "files", "producer job", "inputs"),
          lambda a, _: [a["id"], a["kind"], human_size(a["bytes"]) +
                        (" (deleted)" if a.get("deleted_at") else ""), len(a["files"]),
                        a["producer_job"], ", ".join(a["inputs"])])


def artifacts_pull(artifact_id: str, dest: Path = typer.Argument(..., help="folder")):
    """Download every file of an artifact (a drafter: config and weights), checked
    against the server's sha256, into DEST."""
    c = Client(timeout=600)
    try:
        with Progress(*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), console=console) as prog:
            task = prog.add_task(artifact_id, total=None)
            c.pull_artifact(artifact_id, dest,
                            lambda done, total: prog.update(task, completed=done, total=total))
    except ApiError as e:
        fail(e)
    n = sum(1 for p in dest.rglob("*") if p.is_file())
    console.print(f"pulled {artifact_id} into {dest} ({n} files)")


def artifacts_rm(artifact_id: str):
    """Delete an artifact's files; its row stays as a tombstone (lineage still reads)."""
    try:
        a = Client().delete_artifact(artifact_id)
    except ApiError as e:
        fail(e)
        return
    console.print(f"deleted {artifact_id}: freed {human_size(a['bytes_freed'])}")


def users_list(ctx: typer.Context, json_out: bool = JSON):
    if ctx.invoked_subcommand:
        return
    _list(lambda c: list(c.iter_all("/v1/users")), json_out, "users",
          ("id", "name", "role", "created"),
          lambda u, _: [u["id"], u["name"], u["role"], u.get("created_at")])


def users_add(name: str, role: str = typer.Option("member", help="member|admin"),
              json_out: bool = JSON):
    """Create a user (admin only); prints its token once."""
    try:
        u = Client().create_user(name, role)  # type: ignore[arg-type]  # the API checks it
    except ApiError as e:
        fail(e)
    if json_out:
        return print_json(u)
    console.print(f"user [bold]{u['name']}[/bold] {u['id']} ({u['role']})")
    console.print(f"token (shown once): {u['token']}", markup=False, highlight=False)


def hooks_list(ctx: typer.Context, json_out: bool = JSON):
    if ctx.invoked_subcommand:
        return
    _list(lambda c: c.list_webhooks(100)["data"], json_out, "webhooks",
          ("id", "url", "events", "created"),
          lambda h, _: [h["id"], h["url"], ", ".join(h.get("events") or []) or "all",
                        h.get("created_at")])


def hooks_add(url: str, event: Optional[list[str]] = typer.Option(
        None, "--event", help="e.g. run.finished (repeat); default: all"),
        json_out: bool = JSON):
    """Add a webhook; prints its signing secret once."""
    try:
        h = Client().create_webhook(url, event)
    except ApiError as e:
        fail(e)
    if json_out:
        return print_json(h)
    console.print(f"webhook [bold]{h['id']}[/bold] -> {h['url']}")
    if h.get("secret"):
        console.print(f"signing secret (shown once): {h['secret']}", markup=False,
                      highlight=False)


def hooks_rm(webhook_id: str):
    """Delete a webhook."""
    try:
        Client().delete_webhook(webhook_id)
    except ApiError as e:
        fail(e)
    console.print(f"deleted {webhook_id}")


def hooks_deliveries(webhook_id: str, limit: int = 20, json_out: bool = JSON):
    """The delivery log of a webhook: event, attempts, last status."""
    try:
        data = Client().webhook_deliveries(webhook_id, limit)["data"]
    except ApiError as e:
        fail(e)
    if json_out:
        return print_json(data)
    _table(f"deliveries of {webhook_id}", ("id", "event", "status", "attempts", "last"),
           [[d.get("id"), d.get("event") or d.get("event_type"), d.get("status"),
             d.get("attempts"), d.get("last_status_code") or d.get("response_status")]
            for d in data])


def register(cli: typer.Typer) -> None:
    targets = _group(cli, "targets", "Registered target models.")
    targets.callback(invoke_without_command=True)(targets_list)
    targets.command("add")(targets_add)
    datasets = _group(cli, "datasets", "Datasets (upload one with `draftyard dataset FILE`).")
    datasets.callback(invoke_without_command=True)(datasets_list)
    artifacts = _group(cli, "artifacts", "Artifacts: list them, pull one into a folder, "
                                         "delete one (rm).")
    artifacts.callback(invoke_without_command=True)(artifacts_list)
    artifacts.command("pull")(artifacts_pull)
    artifacts.command("rm")(artifacts_rm)
    users = _group(cli, "users", "The team: list users; admins add them.")
    users.callback(invoke_without_command=True)(users_list)
    users.command("add")(users_add)
    hooks = _group(cli, "webhooks", "Your webhooks: job and run notifications, signed.")
    hooks.callback(invoke_without_command=True)(hooks_list)
    hooks.command("add")(hooks_add)
    hooks.command("rm")(hooks_rm)
    hooks.command("deliveries")(hooks_deliveries)
