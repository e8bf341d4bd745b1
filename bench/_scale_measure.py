"""Measuring tools of bench/scale.py: peak RSS of a stage's process tree (sampled from /proc
through psutil), database rows added, the growth exponent k, and the table."""

from __future__ import annotations

import math
import threading
import time

import psutil

TABLES = ("jobs", "job_events", "artifacts")


class TreeRss:
    """Samples, every `interval` s, every process under the given roots (the API and the
    worker) whose command line runs a stage (`-m workers.stages <type>`), and keeps per stage
    type the peak of the summed RSS of that process and all its descendants (the stage's
    whole tree: prepare's tokenizer pool, ingest's writer thread are in it). The stage
    process's own part is its high-water mark (VmHWM), so that a peak between two samples
    counts: a stage of a few tenths of a second got one or two samples and its peak was
    missed."""

    def __init__(self, roots: list[int], interval: float = 0.1):
        self.roots = roots
        self.interval = interval
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "TreeRss":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)

    def reset(self) -> None:
        self.peak = {}

    def _stage_of(self, p: psutil.Process) -> str | None:
        try:
            argv = p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        for i, a in enumerate(argv[:-1]):
            if a == "workers.stages" and i > 0 and argv[i - 1] == "-m":
                return argv[i + 1]
        return None

    def sample(self) -> None:
        for root in self.roots:
            try:
                kids = psutil.Process(root).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for p in kids:
                stage = self._stage_of(p)
                if stage is None:
                    continue
                try:
                    rss = _hwm(p)
                    for q in p.children(recursive=True):
                        try:
                            rss += q.memory_info().rss
                        except psutil.NoSuchProcess:
                            pass
                except psutil.NoSuchProcess:
                    continue
                if rss > self.peak.get(stage, 0):
                    self.peak[stage] = rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)


def _hwm(p: psutil.Process) -> int:
    """The process's peak RSS so far (VmHWM), else its RSS now."""
    try:
        with open(f"/proc/{p.pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return p.memory_info().rss


def db_counts(engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t: c.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in TABLES}


def k_fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(cost) over log(n): cost ~ n^k."""
    pts = [(math.log(n), math.log(c)) for n, c in points if n > 0 and c > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def k_between(n1: float, c1: float, n2: float, c2: float) -> float | None:
    if min(n1, c1, n2, c2) <= 0 or n1 == n2:
        return None
    return math.log(c2 / c1) / math.log(n2 / n1)


def fmt_n(n: float) -> str:
    return f"{n / 1000:g}K" if n >= 1000 else str(int(n))


def print_table(rows: list[dict]) -> None:
    """rows: {"stage", "n", "wall_s", "records", "rss_mb", "bytes", "rows": {jobs, events,
    artifacts}, "k"}; k is the exponent from the previous size of the same stage."""
    head = (f"{'stage':<17}{'N':>7}{'wall s':>9}{'rec/s':>10}{'peak RSS MB':>13}{'written MB':>12}"
            f"{'jobs':>6}{'events':>8}{'artif':>7}{'k':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        k = "" if r.get("k") is None else f"{r['k']:.2f}"
        rate = r["records"] / r["wall_s"] if r["wall_s"] else 0
        db = r["rows"]
        print(f"{r['stage']:<17}{fmt_n(r['n']):>7}{r['wall_s']:>9.2f}{rate:>10,.0f}"
              f"{r['rss_mb']:>13.0f}{r['bytes'] / 1e6:>12.1f}{db['jobs']:>6}"
              f"{db['job_events']:>8}{db['artifacts']:>7}{k:>7}")
