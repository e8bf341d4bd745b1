"""A throwaway draftyard deployment: its own PostgreSQL database (built by the migrations), a
Redis DB index, an API process and worker processes, all with extra settings of your choice.

Used where a test needs settings the session's API lacks (a user GPU quota) and by
bench/scheduler.py. Importing it changes nothing in this process's environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.services import test_urls
from procgroup import free_port

REPO = Path(__file__).resolve().parents[2]
# Where PostgreSQL and Redis are: tests/services.py (started from PyPI wheels if none answers).
PG_ADMIN, REDIS_BASE = test_urls()


class _Proc:
    def __init__(self, argv: list[str], log: Path, env: dict):
        self.log = log
        self.fh = open(log, "ab")  # noqa: SIM115
        self.p = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, cwd=REPO,
                                  env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def kill(self, sig=signal.SIGTERM) -> None:
        try:
            os.killpg(self.p.pid, sig)
            self.p.wait(15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)
        self.fh.close()

    def tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


class Stack:
    def __init__(self, tag: str, redis_db: int, settings: dict[str, str] | None = None,
                 pg_admin: str | None = None, redis_base: str | None = None,
                 home: Path | None = None):
        # pg_admin / redis_base: servers of its own, home: a folder of its own (a small
        # filesystem) (tests/faults/); else the session's servers and a fresh temp folder.
        self.pg_admin = pg_admin or PG_ADMIN
        self.dbname = f"dy_{tag}_{uuid.uuid4().hex[:8]}"
        self.home = home or Path(tempfile.mkdtemp(prefix=f"draftyard-{tag}-"))
        self.db_url = self.pg_admin.rsplit("/", 1)[0] + f"/{self.dbname}"
        self.redis_url = f"{redis_base or REDIS_BASE}/{redis_db}"
        self.env = {**os.environ, "DRAFTYARD_DATABASE_URL": self.db_url,
                    "DRAFTYARD_BROKER_URL": self.redis_url, "DRAFTYARD_HOME": str(self.home),
                    "DRAFTYARD_HEARTBEAT_S": "0.5", "DRAFTYARD_STALE_AFTER_S": "6",
                    "DRAFTYARD_DATA_ROOTS": "", "DRAFTYARD_MODEL_ROOTS": "",
                    "OMP_NUM_THREADS": "1", **(settings or {})}
        self.procs: list[_Proc] = []
        self.url = ""
        self.token = ""
        self._engine = None

    # -- lifecycle ----------------------------------------------------------------------
    def create(self) -> "Stack":
        """The database (migrated, with an admin whose token lands in home/admin_token)."""
        from sqlalchemy import create_engine, text

        admin = create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{self.dbname}"'))
        admin.dispose()
        from app.core.migrate import upgrade_head

        upgrade_head(self.db_url)
        from sqlalchemy.orm import Session

        from app.users.service import ensure_admin

        with Session(self.engine()) as s:
            ensure_admin(s, self.home)
            s.commit()
        self.token = (self.home / "admin_token").read_text().strip()
        import redis

        # Messages a previous user of this Redis DB left behind must not reach our workers.
        redis.Redis.from_url(self.redis_url).flushdb()
        return self

    def engine(self):
        if self._engine is None:
            from app.core.db import make_engine

            self._engine = make_engine(self.db_url)
        return self._engine

    def start_api(self, log_level: str = "warning") -> str:
        port = free_port()
        p = _Proc([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
                   "--host", "127.0.0.1", "--port", str(port), "--log-level", log_level],
                  self.home / "api.log", self.env)
        self.procs.append(p)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if p.p.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("the API did not start:\n" + p.tail())

    def start_worker(self, node: str, gpus: str | None = None,
                     env: dict[str, str] | None = None) -> _Proc:
        """`env`: settings of this worker only (another clock, a scratch folder)."""
        argv = [sys.executable, "-m", "workers", "--node", node, "--loglevel", "WARNING"]
        if gpus is not None:
            argv += ["--gpus", gpus]
        p = _Proc(argv, self.home / f"worker-{node}.log", {**self.env, **(env or {})})
        self.procs.append(p)
        return p

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def user(self, name: str, role: str = "member") -> str:
        """A new user of this deployment; returns its token."""
        with self.client() as c:
            r = c.post("/v1/users", json={"name": name, "role": role})
            r.raise_for_status()
            return r.json()["token"]

    def wait_nodes(self, names: list[str], timeout: float = 60) -> None:
        with self.client() as c:
            deadline = time.time() + timeout
            while time.time() < deadline:
                got = {n["name"] for n in c.get("/v1/nodes").json()["data"] if n["schedulable"]}
                if set(names) <= got:
                    return
                time.sleep(0.2)
        raise RuntimeError(f"nodes {names} did not register:\n" +
                           "\n".join(p.tail(10) for p in self.procs))

    def close(self) -> None:
        for p in reversed(self.procs):
            p.kill(signal.SIGTERM)
        self.procs.clear()
        if self._engine is not None:
            self._engine.dispose()
        from sqlalchemy import create_engine, text

        admin = create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           f"WHERE datname = '{self.dbname}' AND pid <> pg_backend_pid()"))
            c.execute(text(f'DROP DATABASE IF EXISTS "{self.dbname}"'))
        admin.dispose()
        shutil.rmtree(self.home, ignore_errors=True)


@contextmanager
def running(tag: str, redis_db: int, settings: dict[str, str] | None = None, *,
            workers: dict[str, str | None] | None = None,
            prepare: Callable[[Stack], None] | None = None) -> Iterator[Stack]:
    """A stack with its API up and `workers` ({node: gpus or None}) registered, closed
    afterwards whatever happens; `prepare(stack)` runs before the database is created (to
    point settings at folders of its home)."""
    st = Stack(tag, redis_db, settings)
    if prepare:
        prepare(st)
    try:
        st.create()
        st.start_api()
        for node, gpus in (workers or {}).items():
            st.start_worker(node, gpus=gpus)
        if workers:
            st.wait_nodes(list(workers))
        yield st
    finally:
        st.close()


class Embedded:
    """`draftyard up` as the README's first command runs it: SQLite and the filesystem broker
    under a home of its own, the API and one worker (node `local`) started by `up` itself.
    PostgreSQL's and Redis's URLs are unset and libpq points at a closed port, so nothing of
    it can reach the servers the rest of the suite uses. The session's second backend
    (tests/conftest.py `both_backends`)."""

    node = "local"

    def __init__(self, home: Path, settings: dict[str, str] | None = None):
        self.home = home
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DRAFTYARD_DATABASE_URL", "DRAFTYARD_BROKER_URL")}
        self.env.update(DRAFTYARD_HOME=str(home), DRAFTYARD_DATA_ROOTS=str(home / "data"),
                        DRAFTYARD_MODEL_ROOTS=str(home / "models"), PGHOST="127.0.0.1",
                        PGPORT="1", **(settings or {}))
        self.url = ""
        self.token = ""
        self.proc: _Proc | None = None

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.home / 'draftyard.db'}"

    def start(self, timeout: float = 90) -> "Embedded":
        for d in ("data", "models"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.proc = _Proc([sys.executable, "-m", "app.cli.main", "up", "--port", str(port)],
                          self.home / "up.log", self.env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.p.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    self.token = (self.home / "admin_token").read_text().strip()
                    self._wait_worker(deadline)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("`draftyard up` did not start:\n" + self.proc.tail())

    def _wait_worker(self, deadline: float) -> None:
        with httpx.Client(base_url=self.url, timeout=10,
                          headers={"Authorization": f"Bearer {self.token}"}) as c:
            while time.time() < deadline:
                if any(n["name"] == self.node and n["schedulable"]
                       for n in c.get("/v1/nodes").json()["data"]):
                    return
                time.sleep(0.2)
        raise RuntimeError("the embedded worker did not register:\n" +
                           (self.home / "worker.log").read_text(errors="replace")[-3000:])

    def close(self) -> None:
        """Stop `up`, then every process group still running with this home (its worker and
        the worker's starter and stages live in groups of their own)."""
        from procgroup import group_alive, groups_where, signal_group

        if self.proc is not None:
            self.proc.kill(signal.SIGTERM)
        home = str(self.home)
        left = groups_where(lambda env: env.get("DRAFTYARD_HOME") == home)
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for pgid in left:
                signal_group(pgid, sig)
            deadline = time.time() + wait_s
            while left and time.time() < deadline:
                left = {g for g in left if group_alive(g)}
                time.sleep(0.1)
