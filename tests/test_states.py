"""The job status sets are defined once, in app/jobs/states.py; nothing else spells one."""

from __future__ import annotations

import re
from pathlib import Path

from app.jobs.states import LEASED, TERMINAL, UNFINISHED, WAITING, JobStatus
from draftyard import client

REPO = Path(__file__).resolve().parents[1]
STATUS = "|".join(s.value for s in JobStatus)
# Two or more status strings in one tuple, list or set literal: a status set spelled again.
SPELLED = re.compile(rf"[(\[{{]\s*([\"'])({STATUS})\1\s*,\s*([\"'])({STATUS})\3")


def test_the_sets_partition_the_statuses():
    assert WAITING | LEASED | TERMINAL == set(JobStatus)
    assert not (WAITING & LEASED or LEASED & TERMINAL or WAITING & TERMINAL)
    assert UNFINISHED == set(JobStatus) - TERMINAL


def test_the_python_client_mirrors_the_final_statuses():
    # draftyard/ ships alone (httpx and the standard library), so it keeps a copy; this holds it.
    assert set(client.TERMINAL) == {s.value for s in TERMINAL}


def test_no_product_code_spells_a_status_set():
    found = []
    for folder in ("app", "workers", "contracts", "procgroup"):
        for f in sorted((REPO / folder).rglob("*.py")):
            if f.name == "states.py" and f.parent.name == "jobs":
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if SPELLED.search(line):
                    found.append(f"{f.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "use app/jobs/states.py's sets:\n" + "\n".join(found)
