"""Engine and sessions. One transaction per request or task: the scope commits or rolls back,
services only flush; work registered with `after_commit` runs once the commit is durable."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import lru_cache

from sqlalchemy import create_engine, event, make_url
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.config import get_settings


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while the worker writes; busy_timeout queues writers instead of
    # failing with "database is locked" (embedded mode has API, worker and stages writing).
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _private_sqlite_file(url: str) -> None:
    """Create the SQLite file 0600 before SQLite does (it would use the umask, often 0644):
    it holds every token hash and job of the team. SQLite gives its -wal and -shm files the
    database file's mode."""
    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _private_sqlite_file(url)
        eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(eng, "connect", _sqlite_pragmas)

        @event.listens_for(eng, "begin")
        def _begin_immediate(conn):  # noqa: ANN001
            # Take the write lock at BEGIN so read-then-write transactions (the scheduler,
            # compare-and-set claims) serialise instead of failing on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        @event.listens_for(eng, "connect")
        def _no_pysqlite_begin(dbapi_conn, _rec):  # noqa: ANN001
            dbapi_conn.isolation_level = None

        return eng
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().db_url)


@lru_cache
def get_sessionmaker() -> sessionmaker:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def is_sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"


def after_commit(session: Session, fn: Callable[[], None]) -> None:
    """Run fn after this session's transaction commits (enqueue after commit, never before)."""
    session.info.setdefault("after_commit", []).append(fn)


def _run_after_commit(session: Session) -> None:
    hooks = session.info.pop("after_commit", [])
    for fn in hooks:
        try:
            fn()
        except Exception:  # noqa: BLE001  a lost nudge is recovered by the periodic tick
            import logging

            logging.getLogger("draftyard").exception("after-commit hook failed")


@contextmanager
def unit_of_work() -> Iterator[Session]:
    """A transaction scope for tasks and scripts: commit on success, roll back on error."""
    s = get_sessionmaker()()
    try:
        yield s
        s.commit()
    except BaseException:
        s.rollback()
        s.info.pop("after_commit", None)
        raise
    finally:
        s.close()
    _run_after_commit(s)


def request_session() -> Iterator[Session]:
    """FastAPI dependency (scope="function" so the commit lands before the response)."""
    with unit_of_work() as s:
        yield s
