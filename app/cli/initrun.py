"""`draftyard init-run TARGET DATASET`: a starting run body from a target and a dataset (by
name or id), written to a file to edit, plan and run (bodies needed ids copied
from `--json` output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from app.cli.view import console, fail, help_later, print_error
from draftyard import ApiError, Client


def prompt_only(dataset: dict) -> int:
    """How many of the dataset's records have no assistant answer (ingest's `user_only`)."""
    return int((dataset.get("stats") or {}).get("user_only") or 0)


def starting_body(target: dict, dataset: dict, drafter: str) -> dict:
    """Every stage present with its commonest settings; what is left out takes the stage's
    defaults (contracts/). A dataset with prompt-only records gets a generate stage: prepare
    rejects a record with no answer (`needs_generate`), so without one such a run trains on
    nothing."""
    return {
        "name": f"{dataset['name']}-{drafter}",
        "target_id": target["id"],
        "dataset_id": dataset["id"],
        "drafter": {"type": drafter},
        "chat_template_kwargs": {"enable_thinking": False},
        # Measured on records held out of training (2%, at least 32, at most 500):
        # "in_sample" measures on what it trained on, and the report says so.
        "evaluation": "held_out",
        "seed": 0,
        "stages": {
            # null: keep the dataset's answers; {"backend": ...} has the target write them
            # (the only stage that does), which prompt-only records need.
            "generate": {"backend": "auto"} if prompt_only(dataset) else None,
            "prepare": {"seq_length": 2048},
            "extract": {},
            "train": {"epochs": 3},
            "evaluate": {},
        },
    }


def init_run(target: str = typer.Argument(..., help="target name or id"),
             dataset: str = typer.Argument(..., help="dataset name or id"),
             out: Path = typer.Option(Path("run.json"), "-o", "--out",
                                      help="where to write the body"),
             drafter: Optional[str] = typer.Option(None, help="a drafter type (listed "
                                                   "above)"),
             force: bool = typer.Option(False, help="overwrite an existing file")):
    """Write a starting run body for TARGET and DATASET (then: draftyard plan FILE)."""
    from contracts.drafters import DEFAULT_DRAFTER, drafter_types

    if drafter is None:
        drafter = DEFAULT_DRAFTER
    if drafter not in drafter_types():
        print_error(f"--drafter: {drafter!r} is not one of {', '.join(drafter_types())}")
        raise typer.Exit(2)
    if out.exists() and not force:
        print_error(f"{out} exists already (--force overwrites it)")
        raise typer.Exit(2)
    c = Client()
    try:
        t, d = c.get_target(target), c.get_dataset(dataset)
    except ApiError as e:
        fail(e)
        return
    out.write_text(json.dumps(starting_body(t, d, drafter), indent=2) + "\n")
    # Unwrapped: a long path broken across lines by the console could not be pasted back.
    console.print(f"wrote {out}: target {t['name']} ({t['id']}), dataset {d['name']} "
                  f"({d['id']}, {d.get('num_records')} records)", soft_wrap=True)
    if n := prompt_only(d):
        typer.echo(f"stages.generate is set: {n} of {d.get('num_records')} records of "
                   f"{d['name']} are prompt-only (no assistant answer), and the target "
                   f"writes the answers (without it prepare rejects them: needs_generate)",
                   err=True)
    console.print(f"next: draftyard plan {out}", soft_wrap=True)


def _help() -> str:
    """init-run's help with the drafter types (contracts/drafters.py)."""
    from contracts.drafters import DEFAULT_DRAFTER, drafter_types

    kinds = [f"{t} (the default)" if t == DEFAULT_DRAFTER else t for t in drafter_types()]
    return f"{init_run.__doc__}\n\n\b\ndrafter types: {' | '.join(kinds)}"


def register(cli: typer.Typer) -> None:
    cli.command("init-run", cls=help_later(_help))(init_run)
