"""The job status sets are defined once, in app/jobs/states.py; nothing else spells one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.jobs.states import LEASED, TERMINAL, UNFINISHED, WAITING, JobStatus
from draftyard import client

REPO = Path(__file__).resolve().parents[1]
STATUS = "|".join(s.value for s in JobStatus)


def test_the_sets_partition_the_statuses():
    assert WAITING | LEASED | TERMINAL == set(JobStatus)
    assert not (WAITING & LEASED or LEASED & TERMINAL or WAITING & TERMINAL)
    assert UNFINISHED == set(JobStatus) - TERMINAL


def test_the_python_client_mirrors_the_final_statuses():
    # draftyard/ ships alone (httpx and the standard library), so it keeps a copy; this holds it.
    assert set(client.TERMINAL) == {s.value for s in TERMINAL}


def _status_sets(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module spells a set of statuses: a tuple, list or set literal of two or more
    members that are all statuses (string literals, at least one, or JobStatus members), an
    `or` of `x == "<status>"` tests on the same `x`, or SQL text with `IN ('<status>', ...)`."""
    values = {s.value for s in JobStatus}

    def literal(e: ast.AST) -> bool:
        return isinstance(e, ast.Constant) and e.value in values

    def member(e: ast.AST) -> bool:
        return isinstance(e, ast.Attribute) and e.attr in values

    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Set | ast.Tuple | ast.List) and len(n.elts) >= 2 and \
                all(literal(e) or member(e) for e in n.elts) and any(map(literal, n.elts)):
            found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or):
            tests = [ast.unparse(v.left) for v in n.values if isinstance(v, ast.Compare)
                     and len(v.ops) == 1 and isinstance(v.ops[0], ast.Eq)
                     and literal(v.comparators[0])]
            if len(tests) >= 2 and len(set(tests)) < len(tests):
                found.append((n.lineno, ast.unparse(n)))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and SQL_IN.search(n.value):
            found.append((n.lineno, n.value.strip()[:80]))
    return found


SQL_IN = re.compile(rf"\bIN\s*\(\s*'({STATUS})'\s*,", re.I)


def test_the_status_set_finder_finds_each_spelling():
    src = """
a = ("succeeded", "failed")
b = {JobStatus.queued, "pending"}
c = ["running",
     "cancelling"]
d = job.status == "failed" or job.status == "cancelled"
e = "SELECT 1 FROM jobs WHERE status IN ('pending', 'queued')"
ok = ("succeeded", "a plain word") or x == "failed" or y == "cancelled"
"""
    assert [n for n, _ in _status_sets(ast.parse(src))] == [2, 3, 4, 6, 7]


def test_no_product_code_spells_a_status_set():
    found = []
    for folder in ("app", "workers", "contracts", "procgroup"):
        for f in sorted((REPO / folder).rglob("*.py")):
            if f.name == "states.py" and f.parent.name == "jobs":
                continue
            found += [f"{f.relative_to(REPO)}:{n}: {text}"
                      for n, text in _status_sets(ast.parse(f.read_text()))]
    assert not found, "use app/jobs/states.py's sets:\n" + "\n".join(found)
