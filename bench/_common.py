"""Shared bench helpers: scratch PostgreSQL databases and the last-line JSON result."""

from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The Redis database of a bench's own deployment (the tests use 0-12). Two benches running at
# once would share its queues: give the second another one (DRAFTYARD_BENCH_REDIS_DB=13 or 14).
REDIS_DB = int(os.environ.get("DRAFTYARD_BENCH_REDIS_DB", "15"))


@contextmanager
def scratch_database():
    from sqlalchemy import create_engine, text

    name = f"dy_bench_{uuid.uuid4().hex[:8]}"
    eng = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with eng.connect() as c:
            c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"))
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        eng.dispose()


def result(bench: str, metric: str, value: float, baseline: float, target: float,
           higher_is_better: bool = True) -> dict:
    ratio = value / baseline if baseline else 0.0
    ok = ratio >= target if higher_is_better else ratio <= target
    return {"bench": bench, "metric": metric, "value": round(value, 4),
            "baseline": round(baseline, 4), "ratio": round(ratio, 4), "target": target, "pass": ok}


def emit(results: dict | list) -> None:
    print(json.dumps(results))
