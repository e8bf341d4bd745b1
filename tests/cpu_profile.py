"""Where `make test`'s time goes: CPU seconds per test, summed over the test process's whole
/proc tree (the API, worker and stage processes it started: live descendants' utime+stime plus
what their reaped children used), with the test's wall time.

    make test-profile        # writes tmp/cpu-profile/<xdist worker>.jsonl, prints the top 25

A process that is reaped outside the tree (the demo's embedded service) is not counted: its
test shows a wall far above its CPU. Used to set LONG_FIRST in tests/conftest.py."""
import json
import os
import time

import pytest

TCK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int) -> float:
    kids: dict[int, list[int]] = {}
    cpu: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        pid, ppid = int(d), int(rest[1])
        kids.setdefault(ppid, []).append(pid)
        cpu[pid] = sum(int(x) for x in rest[11:15])
    tot, stack = 0, [root]
    while stack:
        p = stack.pop()
        tot += cpu.get(p, 0)
        stack.extend(kids.get(p, []))
    return tot / TCK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, t0 = _tree_cpu(os.getpid()), time.monotonic()
    yield
    c1, t1 = _tree_cpu(os.getpid()), time.monotonic()
    out = os.environ.get("DRAFTYARD_CPU_PROFILE", "tmp/cpu-profile")
    os.makedirs(out, exist_ok=True)
    w = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{out}/{w}.jsonl", "a") as f:
        f.write(json.dumps({"id": item.nodeid, "cpu": round(c1 - c0, 2), "wall": round(t1 - t0, 2),
                            "w": w, "t": round(t0, 1)}) + "\n")


def main() -> None:
    """Print the profile `make test-profile` wrote: the total and the 25 costliest tests."""
    from pathlib import Path

    out = Path(os.environ.get("DRAFTYARD_CPU_PROFILE", "tmp/cpu-profile"))
    rows = sorted((json.loads(line) for f in out.glob("*.jsonl")
                   for line in f.read_text().splitlines()), key=lambda r: -r["cpu"])
    print(f"{sum(r['cpu'] for r in rows):.0f} CPU-s in {len(rows)} tests")
    for r in rows[:25]:
        print(f"{r['cpu']:7.1f} CPU-s {r['wall']:7.1f} s  {r['w']}  {r['id'].split('@')[0]}")


if __name__ == "__main__":
    main()
