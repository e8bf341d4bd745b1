"""`draftyard storage` (who uses the disk: GET /v1/storage), `draftyard storage prune
[--dry-run]` (what retention removes) and `draftyard artifacts rm ART_ID` lives beside the
other artifact commands (app/cli/resources.py)."""

from __future__ import annotations

import typer

from app.cli.resources import _table
from app.cli.view import console, fail, print_json
from contracts.storage import human_bytes as size
from draftyard import ApiError, Client

JSON = typer.Option(False, "--json", help="the API's JSON")


def print_usage(u: dict) -> None:
    _table("volumes", ("volume", "path", "total", "used", "free", "reserved",
                       "free after reservations"),
           [[v["name"] + (f" (= {v['same_as']})" if v.get("same_as") else ""), v["path"],
             size(v["total_bytes"]), size(v["used_bytes"]), size(v["free_bytes"]),
             size(v["reserved_bytes"]), size(v["free_after_reservations_bytes"])]
            for v in u["volumes"]])
    a = u["artifacts"]
    console.print(f"artifacts: {a['count']} live, {size(a['bytes'])}; deleted "
                  f"{u['deleted']['count']} (freed {size(u['deleted']['bytes_freed'])}); "
                  f"reclaimable now {size(u['reclaimable']['bytes'])} "
                  f"({u['reclaimable']['count']} items: `draftyard storage prune --dry-run`)")
    _table("by kind", ("kind", "count", "bytes"),
           [[k["kind"], k["count"], size(k["bytes"])] for k in u["by_kind"]])
    _table("by owner", ("owner", "count", "bytes", "quota"),
           [[o["name"] or o["owner"], o["count"], size(o["bytes"]),
             size(o["quota_bytes"]) if o.get("quota_bytes") else "none"] for o in u["by_owner"]])
    _table("by run", ("run", "name", "count", "bytes"),
           [[r["run_id"], r["name"], r["count"], size(r["bytes"])] for r in u["by_run"]])
    check = u.get("check") or {}
    if check.get("missing"):
        console.print(f"[red]artifacts without files (no tombstone): "
                      f"{', '.join(check['missing'])}[/red]")


def storage(ctx: typer.Context, json_out: bool = JSON):
    """Bytes by kind, owner and run; free and reserved per volume; reclaimable bytes."""
    if ctx.invoked_subcommand:
        return
    try:
        u = Client().storage()
    except ApiError as e:
        fail(e)
        return
    print_json(u) if json_out else print_usage(u)


def prune(dry_run: bool = typer.Option(False, "--dry-run", help="only list what would go"),
          json_out: bool = JSON):
    """Remove what retention allows now (admins), or list it (--dry-run)."""
    try:
        r = Client().prune_storage(dry_run=dry_run)
    except ApiError as e:
        fail(e)
        return
    if json_out:
        print_json(r)
        return
    _table("would go" if dry_run else "removed", ("what", "id", "bytes", "owner", "why"),
           [[i["what"], i["id"], size(i["bytes"]), i["owner"], i["reason"]]
            for i in r["items"]])
    verb = "would free" if dry_run else "freed"
    console.print(f"{verb} {size(r['bytes'] if dry_run else r['bytes_freed'])}")


def register(cli: typer.Typer) -> None:
    app = typer.Typer(help="Disk usage (`storage`), retention (`storage prune`).",
                      no_args_is_help=False)
    cli.add_typer(app, name="storage")
    app.callback(invoke_without_command=True)(storage)
    app.command("prune")(prune)
