"""`draftyard demo` (filled in by the demo issue; until then a probe job end to end)."""

from __future__ import annotations


def run_demo(json_out: bool = False, quick: bool = False, keep: bool = False) -> int:
    from app.cli.probe_demo import run_probe_demo

    return run_probe_demo(json_out=json_out)
