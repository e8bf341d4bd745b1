"""Rendering for the CLI: tables, JSON listings, owner names and live progress bars."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Column, Table

from app.jobs.states import TERMINAL
from draftyard import NotFound

console = Console()


def help_later(text: Callable[[], str]) -> type:
    """A command class (`@cli.command(cls=...)`) whose help is `text()`, made when a help is
    shown. A help listing what contracts/ defines (job types, drafter types, formats) made at
    import would build every params model of contracts/ in each `draftyard` start (~55 ms of
    its ~350 ms of CPU), for lists only `--help` shows."""
    from typer.core import TyperCommand

    class Command(TyperCommand):
        @property  # type: ignore[override]
        def help(self) -> str:
            return text()

        @help.setter
        def help(self, _value: str | None) -> None:
            pass  # click sets the function's docstring: text() has it

    return Command


def describe(e) -> str:
    """An API failure in one line; a 401 says where the token comes from."""
    text = str(e)
    if getattr(e, "status", None) == 401:
        import os
        from pathlib import Path

        home = Path(os.environ.get("DRAFTYARD_HOME") or Path.home() / ".draftyard").expanduser()
        text += (f" (set DRAFTYARD_TOKEN to your token; the embedded server's admin token is "
                 f"in {home / 'admin_token'}, under DRAFTYARD_HOME)")
    return text


def fail(e, code: int = 1) -> None:
    """An API failure as one red line, then exit `code`."""
    import typer

    print_error(describe(e))
    raise typer.Exit(code)


def print_error(text: str) -> None:
    """One line on the terminal (soft wrap: never broken at the terminal's width)."""
    console.print(error_line(text), soft_wrap=True)


def error_line(text: str):
    """`error <text>`, the word red, the text as it is (no markup read from it)."""
    from rich.text import Text

    return Text.assemble(("error", "red"), " ", text)


def read_text_file(path, option: str) -> str:
    """A file the CLI sends as text (a chat template): one line naming the file when it
    cannot be read, exit 2."""
    import typer

    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        why = "no such file"
    except IsADirectoryError:
        why = "is a folder, not a file"
    except (OSError, UnicodeDecodeError) as e:
        why = f"cannot be read: {e.__class__.__name__}: {getattr(e, 'strerror', None) or e}"
    print_error(f"{option} {path}: {why}")
    raise typer.Exit(2)


def num(x) -> str:
    """A tau-like number with two decimals; '-' when there is none."""
    return f"{x:.2f}" if isinstance(x, (int, float)) else "-"


def human_size(n: float | None) -> str:
    """Bytes as people read them: 512 B, 1.5 MiB."""
    x = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return ""


def hanging(label: str, text: str, style: str = "") -> Table:
    """`label text` with the text's wrapped lines under its first, not at the margin (a
    plan's check at 80 columns reads as one item, never as words at column 0)."""
    from rich.text import Text

    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style=style)
    t.add_column(ratio=1)
    t.add_row(label, Text(text))
    return t


def print_failures(job: dict, indent: str = "  ", log=None) -> None:
    """The records a job dropped, by id, input line, reason and message: from its
    error's details when it stopped on its failure budget, else from its summary."""
    log = log or console.print
    details = (job.get("error") or {}).get("details")
    src = details if isinstance(details, dict) and "failed_sample" in details else \
        (job.get("metrics_summary") or {})
    sample = src.get("failed_sample") or []
    for f in sample:
        line = f" line {f['line']}" if f.get("line") is not None else ""
        log(f"{indent}record {f.get('id')}{line}: {f.get('reason')}: {f.get('message') or ''}",
            markup=False, highlight=False)
    total = src.get("num_failed") or src.get("num_rejected")
    if sample and isinstance(total, int) and total > len(sample):
        log(f"{indent}... {total - len(sample)} more", markup=False)
    if sample and src.get("failures_file"):
        log(f"{indent}full list: {src['failures_file']}", markup=False)


def verdict_line(rep: dict) -> str:
    """The verdict first, then the numbers it rests on."""
    v = rep.get("verdict")
    color = "green" if v == "accept" else "red"
    oov = rep.get("oov_share")
    oov_s = f"; {oov:.0%} of reference tokens outside the draft vocabulary" if oov else ""
    return (f"verdict [{color}]{v}[/{color}]: {rep.get('verdict_reason') or ''}\n"
            f"  tau {num(rep.get('tau'))} (tau_sim {num(rep.get('tau_sim'))}), untrained "
            f"{num(rep.get('tau_baseline'))}, prompt lookup "
            f"{num(rep.get('tau_prompt_lookup'))}{oov_s}")


def print_json(obj) -> None:
    """`--json`: the API's objects as they came, for scripts (plain print: no wrapping)."""
    print(json.dumps(obj, indent=1, default=str))


def owner_names(client) -> dict[str, str]:
    """user id -> name, so listings show who, not `usr_...` (GET /v1/users); {} when the
    server predates that endpoint."""
    try:
        return {u["id"]: u["name"] for u in client.iter_all("/v1/users")}
    except NotFound:
        return {}


ID_COLUMNS = frozenset({"id", "artifact"})


class Listing:
    """A table where it fits the terminal, else one `column: value` block per row
    (at 80 columns a nine-column table was folded one character per line, and lineage ids were
    squeezed into 4-character columns). It fits when every column gets the width of its
    longest word (an id, a path, a status) and id columns their full width: a table never
    breaks a word, so nothing has to be pasted back together. Decided at render time, from
    the width of the console that prints it, so every listing of the CLI gets it."""

    def __init__(self, title: str, cols: tuple[str, ...], rows: list[list[str]]):
        self.title, self.cols, self.rows = title, cols, rows

    def _plain(self, cell: str) -> str:
        from rich.text import Text

        return Text.from_markup(cell).plain

    def min_width(self) -> int:
        """The narrowest table that breaks no word: columns at their longest word (ids
        whole), one space of padding each side and a border between and around."""
        need = 0
        for i, c in enumerate(self.cols):
            cells = [self._plain(r[i]) for r in self.rows]
            if c in ID_COLUMNS:
                widest = max([len(c), *(len(x) for x in cells)])
            else:
                widest = max([len(w) for w in c.split()] +
                             [len(w) for x in cells for w in x.split()])
            need += widest + 3
        return need + 1

    def table(self) -> Table:
        t = Table(title=self.title)
        for c in self.cols:
            # the table is shown only where no word needs breaking (min_width)
            t.add_column(c, no_wrap=c in ID_COLUMNS, overflow="fold")
        for r in self.rows:
            t.add_row(*r)
        return t

    def blocks(self, width: int) -> list:
        """The rows as lists: `column: value` lines, the values aligned; a value too long
        for the rest of the line goes whole on the next line, indented (an id or a path is
        never broken to fit beside its name)."""
        from rich.text import Text

        pad = max(len(c) for c in self.cols) + 2
        out: list = [Text(self.title, style="italic")]
        for r in self.rows:
            out.append(Text(""))
            for c, v in zip(self.cols, r):
                if v == "":
                    continue
                value = Text.from_markup(v)
                key = Text(f"{c}:".ljust(pad), style="bold")
                if pad + value.cell_len <= width or " " in value.plain:
                    out.append(key + value)
                else:
                    out += [Text(f"{c}:", style="bold"), Text("  ") + value]
        return out

    def __rich_console__(self, console, options):
        if self.min_width() <= options.max_width:
            yield self.table()
        else:
            yield from self.blocks(options.max_width)


def make_table(title: str, cols: tuple[str, ...], rows: list[list]) -> Listing:
    """A listing whose ids are never cut (`job_01m8sbq…` cannot be copied) and whose
    words are never broken: a table where it fits, else `column: value` blocks (Listing)."""
    return Listing(title, cols, [[("" if v is None else str(v)) for v in r] for r in rows])


def jobs_table(jobs: list[dict], title: str = "jobs", names: dict | None = None) -> Listing:
    rows = []
    for j in jobs:
        p = j.get("progress") or {}
        prog = (f"{p.get('done', 0):g}/{p.get('total') or '?'} {p.get('unit') or ''}"
                if p else "")
        why = (j.get("error") or {}).get("message") or j.get("pending_reason") or ""
        gpus = ",".join(f"{g['node']}:{g['index']}" for g in j.get("gpus_assigned") or []) or str(
            j.get("gpus_requested", 0))
        owner = (names or {}).get(j.get("owner"), j.get("owner"))
        rows.append([j["id"], j["type"], j["status"], owner, gpus, prog, why[:80]])
    return make_table(title, ("id", "type", "status", "owner", "gpus", "progress",
                              "reason / error"), rows)


def duration(seconds: float) -> str:
    s = round(seconds)
    return (f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600
            else f"{s // 3600}h{s % 3600 // 60:02d}m")


def progress_info(status: str, p: dict) -> str:
    """What a job's progress bar says beside the bar, from the job's `progress` (the same
    fields the dashboard shows, app/dashboard/app.js `progress`): the phase and its place
    when the stage has phases, done/total, the rate (a slow one as seconds per unit: a
    one-minute train step reads "60 s each", not "0.0/s") and the ETA."""
    parts = [status]
    if p.get("phase"):
        parts.append(f"{p['phase']} ({p.get('phase_index')}/{p.get('phases')})")
    if p.get("unit"):
        parts.append(f"{p.get('done', 0):g}/{p.get('total') or '?'} {p['unit']}")
    rate = p.get("rate")
    if rate:
        parts.append(f"{rate:.1f}/s" if rate >= 0.1 else f"{1 / rate:.0f} s each")
    if p.get("eta_s") is not None and status == "running":
        parts.append(f"ETA {duration(p['eta_s'])}")
    return " ".join(parts)


def progress_columns(names: list[str]) -> tuple:
    """The columns of `follow_jobs`: the name as wide as the longest, a bar and its percent
    that never shrink, then the info, which is cut with an ellipsis where the terminal ends
    (at 80 columns the bar used to be squeezed to nothing behind a padded name)."""
    width = max(map(len, names), default=8)
    return (TextColumn(f"{{task.description:<{width}}}",
                       table_column=Column(min_width=width, no_wrap=True)),
            BarColumn(bar_width=16, table_column=Column(min_width=16, no_wrap=True)),
            TaskProgressColumn(table_column=Column(min_width=4, no_wrap=True)),
            TextColumn("{task.fields[info]}", table_column=Column(ratio=1, no_wrap=True,
                                                                  overflow="ellipsis")))


def follow_jobs(client, job_ids: list[str], labels: dict[str, str] | None = None,
                poll: float = 0.5) -> list[dict]:
    """Live progress bars for jobs until all are finished; returns their final objects."""
    labels = labels or {}
    # expand: the info column takes what the terminal has left, not its text's width.
    with Progress(*progress_columns([labels.get(j, j) for j in job_ids]), console=console,
                  transient=False, expand=True) as prog:
        tasks = {j: prog.add_task(labels.get(j, j), total=None, info="") for j in job_ids}
        while True:
            jobs = [client.get_job(j) for j in job_ids]
            for job in jobs:
                p = job.get("progress") or {}
                total = p.get("total")
                info = progress_info(job["status"], p)
                if job["status"] == "succeeded" and not total:
                    total, p = 1, {"done": 1}
                prog.update(tasks[job["id"]], total=total, completed=p.get("done") or 0, info=info)
            if all(j["status"] in TERMINAL for j in jobs):
                return jobs
            time.sleep(poll)
