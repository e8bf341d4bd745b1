"""Engine and sessions. One transaction per request or task: the scope commits or rolls back,
services only flush; work registered with `after_commit` runs once the commit is durable."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

import logging

from fastapi import Request
from sqlalchemy import create_engine, event, exc, make_url
from sqlalchemy.engine import Connection, CursorResult, Engine, Result
from sqlalchemy.orm import Session, sessionmaker

from app.core.clock import db_now, utcnow  # noqa: F401  (the one clock; re-exported)
from app.core.config import get_settings

log = logging.getLogger("draftyard")
# Execution option of read-only sessions (`unit_of_work(read_only=True)`, GET requests).
READ_ONLY = "draftyard_read_only"


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while the worker writes; busy_timeout queues writers instead of
    # failing with "database is locked" (embedded mode has API, worker and stages writing).
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _refuse_nul(conn, cursor, statement, parameters, context, executemany) -> None:
    """SQLite stores a NUL character in text where PostgreSQL refuses it ("A string literal
    cannot contain NUL (0x00) characters."): refuse it here too, as the same DBAPI DataError,
    so a request answers the same 422 on both backends (app/core/errors.py) and embedded data
    moves to PostgreSQL as it is. JSON values are bounded at the edge (contracts/bounds.py);
    this covers plain columns (names, cursors, messages)."""
    import sqlite3

    for row in (parameters if executemany else (parameters,)):
        values = row.values() if isinstance(row, dict) else row or ()
        if any(isinstance(v, str) and "\x00" in v for v in values):
            raise sqlite3.DataError("A string literal cannot contain NUL (0x00) characters.")


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


# A connection whose peer is unreachable fails within ~10 s: unacknowledged data after
# tcp_user_timeout (ms), or an idle one after keepalives_idle + count * interval. Both ends:
# the server's side (`options`) too, or a partitioned worker's session that held the
# scheduler's advisory lock or a row lock kept it, and every other node waited on it until
# the link came back (tests/machines/test_partition.py).
PG_CONNECT_ARGS = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 4,
                   "keepalives_interval": 2, "keepalives_count": 3, "tcp_user_timeout": 10000,
                   "options": "-c tcp_keepalives_idle=4 -c tcp_keepalives_interval=2 "
                              "-c tcp_keepalives_count=3 -c tcp_user_timeout=10000"}


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _private_sqlite_file(url)
        eng = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(eng, "connect", _sqlite_pragmas)
        event.listen(eng, "before_cursor_execute", _refuse_nul)

        @event.listens_for(eng, "begin")
        def _begin(conn):
            # A transaction that may write takes the write lock at BEGIN, so read-then-write
            # transactions (the scheduler, compare-and-set claims) serialise instead of
            # failing on upgrade. A read-only one must not: with WAL it reads a snapshot
            # beside the writer, where BEGIN IMMEDIATE would queue every GET behind the
            # write lock.
            read_only = conn.get_execution_options().get(READ_ONLY)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        @event.listens_for(eng, "connect")
        def _no_pysqlite_begin(dbapi_conn, _rec):
            dbapi_conn.isolation_level = None

        return eng
    # connect_timeout: during a DB outage a connect must fail, not hang, so that a supervisor
    # retrying through it can still give up in time (workers/supervisor.py). A network
    # partition drops packets instead of refusing them: without keepalives and a TCP user
    # timeout a call on an open connection waited for an answer that never came, and the
    # supervisor never reached its give-up (tests/machines/test_partition.py).
    eng = create_engine(url, pool_size=10, max_overflow=20, connect_args=PG_CONNECT_ARGS)
    _check_on_checkout(eng)
    return eng


# A pooled connection given back less than this long ago, whose socket has received nothing
# since, is taken without a ping (see `_check_on_checkout`).
QUIET_S = 2.0


def _quiet(dbapi_conn, errors: type[Exception]) -> bool:
    """Nothing arrived on the connection's socket since it was last used. A server that
    closed it (a restart, a terminated backend, its host's kernel after a crash) or a socket
    error (the TCP keepalives of PG_CONNECT_ARGS) makes it readable."""
    try:
        p = select.poll()
        p.register(dbapi_conn.fileno(), select.POLLIN | select.POLLPRI)
        return not p.poll(0)
    except (OSError, ValueError, errors):  # a closed connection has no socket to ask
        return False


def _check_on_checkout(eng: Engine) -> None:
    """SQLAlchemy's pre-ping without its round trip for a connection in steady use: a ping
    per checkout was one of the four round trips of a one-row GET (ping, BEGIN, SELECT,
    COMMIT). A connection is pinged when it comes back from a rest (QUIET_S) or when its
    socket shows that the server said something (a close, an error); a failed ping
    invalidates the pool, as pre-ping's does, and the pool connects afresh (SQLAlchemy's
    documented pessimistic "checkout" handler). tests/service/test_db_sessions.py."""
    errors = eng.dialect.loaded_dbapi.Error

    @event.listens_for(eng, "connect")
    def _fresh(_dbapi_conn, record) -> None:
        record.info["used_at"] = time.monotonic()

    @event.listens_for(eng, "checkin")
    def _used(_dbapi_conn, record) -> None:
        if record is not None:
            record.info["used_at"] = time.monotonic()

    @event.listens_for(eng, "checkout")
    def _ping(dbapi_conn, record, _proxy) -> None:
        if time.monotonic() - record.info.get("used_at", 0.0) < QUIET_S \
                and _quiet(dbapi_conn, errors):
            return
        try:
            eng.dialect.do_ping(dbapi_conn)
        except errors as e:
            raise exc.InvalidatePoolError() from e


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().db_url)


@lru_cache
def _read_engine() -> Engine:
    """The engine of read-only scopes. On PostgreSQL a read runs without BEGIN and COMMIT (two
    round trips of the three a one-row read costs): under READ COMMITTED each statement reads
    its own snapshot in a transaction too, so no read sees anything else. Read-only scopes
    take no locks and write nothing."""
    eng = get_engine()
    opts: dict = {READ_ONLY: True}
    if eng.dialect.name == "postgresql":
        opts["isolation_level"] = "AUTOCOMMIT"
    return eng.execution_options(**opts)


@lru_cache
def get_sessionmaker(read_only: bool = False) -> sessionmaker:
    return sessionmaker(bind=_read_engine() if read_only else get_engine(),
                        expire_on_commit=False)


@contextmanager
def read_connection() -> Iterator[Connection]:
    """A read-only connection without a Session: for the reads every client polls, where a
    Session and an ORM instance cost a third of a one-row read (~0.18 ms of ~0.5 ms measured
    here, the round trip itself ~0.15 ms)."""
    with _read_engine().connect() as conn:
        yield conn


def rowcount(result: Result) -> int:
    """Rows an UPDATE/DELETE matched (`Session.execute` is typed as returning a plain
    `Result`, but a DML statement's is a `CursorResult`)."""
    assert isinstance(result, CursorResult)
    return result.rowcount


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
        except Exception:  # a lost nudge is recovered by the periodic tick
            log.exception("after-commit hook failed")


@contextmanager
def unit_of_work(read_only: bool = False) -> Iterator[Session]:
    """A transaction scope for tasks and scripts: commit on success, roll back on error.
    `read_only`: the scope only reads (in embedded mode it does not wait for the writer)."""
    s = get_sessionmaker(read_only)()
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


# Methods that never write: their requests read beside the writer instead of queueing on it.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_session(request: Request) -> Iterator[Session]:
    """FastAPI dependency (scope="function" so the commit lands before the response)."""
    with unit_of_work(read_only=request.method in SAFE_METHODS) as s:
        yield s
