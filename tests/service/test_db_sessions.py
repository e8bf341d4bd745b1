"""Embedded mode (SQLite): a read-only transaction reads beside the writer instead of queueing
on SQLite's write lock; a transaction that may write still takes it at BEGIN."""

from __future__ import annotations

import sqlite3
import threading

from sqlalchemy import text
from sqlalchemy.orm import Session
from starlette.requests import Request

from app.core.db import READ_ONLY, make_engine, request_session


def _in_thread(fn, timeout: float) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    return t, out


def test_reads_do_not_queue_on_the_write_lock_but_writes_do(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    eng = make_engine(url)
    with eng.begin() as c:
        c.execute(text("CREATE TABLE t (x INTEGER)"))
        c.execute(text("INSERT INTO t VALUES (1)"))
    writer = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None, timeout=30)
    writer.execute("BEGIN IMMEDIATE")  # someone holds the write lock (a long write)
    writer.execute("INSERT INTO t VALUES (2)")

    def read():
        with Session(eng.execution_options(**{READ_ONLY: True})) as s:
            return s.execute(text("SELECT count(*) FROM t")).scalar()

    def write():
        with Session(eng) as s, s.begin():
            s.execute(text("INSERT INTO t VALUES (3)"))
        return "written"
    try:
        t, got = _in_thread(read, 3)
        assert not t.is_alive() and got == [1], "a read waited for the writer"
        w, wrote = _in_thread(write, 1)
        assert w.is_alive(), "a write did not wait for the write lock"
    finally:
        writer.execute("COMMIT")
        writer.close()
    w.join(10)
    assert wrote == ["written"]
    eng.dispose()


def _session_of(database, method: str) -> tuple[Session, object]:
    req = Request({"type": "http", "method": method, "path": "/", "headers": [],
                   "query_string": b""})
    gen = request_session(req)
    return next(gen), gen


def test_get_requests_get_read_only_sessions(database):
    for method, ro in (("GET", True), ("HEAD", True), ("POST", False), ("DELETE", False)):
        s, gen = _session_of(database, method)
        assert bool(s.connection().get_execution_options().get(READ_ONLY)) is ro, method
        gen.close()


def test_reads_on_postgresql_run_without_begin_and_commit(database):
    """A read-only scope is one round trip a statement: no BEGIN, no COMMIT (READ COMMITTED
    gives each statement its own snapshot either way); a scope that may write still runs in
    a transaction."""
    from psycopg.pq import TransactionStatus

    from app.core.db import unit_of_work

    with unit_of_work(read_only=True) as s:
        assert s.execute(text("SELECT 1")).scalar() == 1
        raw = s.connection().connection.driver_connection
        assert raw.autocommit and raw.info.transaction_status == TransactionStatus.IDLE
    with unit_of_work() as s:
        s.execute(text("SELECT 1"))
        raw = s.connection().connection.driver_connection
        assert not raw.autocommit and raw.info.transaction_status == TransactionStatus.INTRANS


def test_pooled_connections_are_pinged_only_after_a_rest_or_a_close(database, monkeypatch):
    """A connection in steady use is taken without a ping; one whose server closed it (here
    its backend is terminated) is pinged, found dead and replaced, so the caller never sees
    the dead one; one back from a rest longer than QUIET_S is pinged."""
    import time

    from app.core import db as dbmod
    from tests.conftest import _admin_engine

    eng = make_engine(database)
    pings: list[int] = []
    real = eng.dialect.do_ping
    monkeypatch.setattr(eng.dialect, "do_ping", lambda c: (pings.append(1), real(c))[1])

    def pid() -> int:
        with eng.connect() as c:
            return c.execute(text("SELECT pg_backend_pid()")).scalar_one()
    try:
        first = pid()
        assert [pid() for _ in range(5)] == [first] * 5 and pings == []
        admin = _admin_engine()
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first})
            deadline = time.monotonic() + 10
            while c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                            {"p": first}).scalar() and time.monotonic() < deadline:
                time.sleep(0.05)
        admin.dispose()
        second = pid()
        assert second != first and len(pings) == 1
        monkeypatch.setattr(dbmod, "QUIET_S", 0.0)
        assert pid() == second and len(pings) == 2
    finally:
        eng.dispose()
