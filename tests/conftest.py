"""Service test harness: a fresh PostgreSQL database built by the migrations, a Redis DB, a real
uvicorn API process and real worker processes (Celery) against them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.services import test_urls
from procgroup import free_port

REPO = Path(__file__).resolve().parents[1]
# Where PostgreSQL and Redis are: tests/services.py (started from PyPI wheels if none answers).
PG_ADMIN, REDIS_BASE = test_urls()

# `make test` runs the suite in parallel (pytest-xdist): each test process is one session
# with its own database, home and Redis DBs. Redis has 16 DBs (0-15); process i (gw<i>, or
# pid % 5 for a plain pytest, so that two plain runs rarely meet) owns DBs 3i+1 .. 3i+3:
# the first for its session's services, the others for the stacks its tests start
# (tests/service/stack.py) one at a time.
_SLOT = (int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
         if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") else os.getpid()) % 5
REDIS_DBS = (3 * _SLOT + 1, 3 * _SLOT + 2, 3 * _SLOT + 3)

# One database and one Redis DB per test session, set before app settings are first read.
_DBNAME = f"dy_test_{uuid.uuid4().hex[:10]}"
_HOME = Path(tempfile.mkdtemp(prefix="draftyard-test-"))
TEST_ENV = {
    "DRAFTYARD_DATABASE_URL": PG_ADMIN.rsplit("/", 1)[0] + f"/{_DBNAME}",
    "DRAFTYARD_BROKER_URL": f"{REDIS_BASE}/{REDIS_DBS[0]}",
    "DRAFTYARD_HOME": str(_HOME),
    "DRAFTYARD_HEARTBEAT_S": "0.5",
    "DRAFTYARD_STALE_AFTER_S": "6",
    "DRAFTYARD_CANCEL_GRACE_S": "2",
    "DRAFTYARD_DATA_ROOTS": str(_HOME / "data"),
    "DRAFTYARD_MODEL_ROOTS": str(_HOME / "models"),
    "OMP_NUM_THREADS": "1",
    # The webhook receivers of the tests listen here (tests/service/receiver.py); every other
    # internal address stays refused.
    "DRAFTYARD_WEBHOOK_ALLOWED_HOSTS": "127.0.0.2",
}
os.environ.update(TEST_ENV)
# Bytecode caches on where the environment turned them off (PYTHONDONTWRITEBYTECODE=1, as
# this box's shell does): without them each API, worker and CLI process that the tests start
# compiles the project's sources again (~0.3 CPU-s an API or worker start: 1.33 -> 1.02
# measured), and this process rewrites every test module's asserts again (2.2 CPU-s).
# __pycache__ is ignored by git; Python writes it atomically and checks it against the
# source's mtime.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
(_HOME / "data").mkdir(parents=True, exist_ok=True)
(_HOME / "models").mkdir(parents=True, exist_ok=True)


def _admin_engine():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def database():
    """Create the test database and build its schema by running the migrations."""
    from sqlalchemy import text

    eng = _admin_engine()
    with eng.connect() as c:
        c.execute(text(f'CREATE DATABASE "{_DBNAME}"'))
    from app.core.migrate import upgrade_head

    upgrade_head(TEST_ENV["DRAFTYARD_DATABASE_URL"])
    import redis

    redis.Redis.from_url(TEST_ENV["DRAFTYARD_BROKER_URL"]).flushdb()
    from app.wiring import wire

    wire()  # in-process service calls change job status too (app/jobs/lifecycle.py)
    yield TEST_ENV["DRAFTYARD_DATABASE_URL"]
    from app.core.db import get_engine

    get_engine().dispose()
    with eng.connect() as c:
        c.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       f"WHERE datname = '{_DBNAME}' AND pid <> pg_backend_pid()"))
        c.execute(text(f'DROP DATABASE IF EXISTS "{_DBNAME}"'))
    eng.dispose()


@pytest.fixture
def db(database):
    """A session in a transaction that is rolled back after the test."""
    from sqlalchemy.orm import Session

    from app.core.db import get_engine

    conn = get_engine().connect()
    trans = conn.begin()
    s = Session(bind=conn, join_transaction_mode="create_savepoint")
    yield s
    s.close()
    trans.rollback()
    conn.close()


class Proc:
    def __init__(self, argv: list[str], log: Path, env: dict | None = None,
                 full_env: dict | None = None):
        self.log = log
        self.fh = open(log, "ab")  # noqa: SIM115
        self.p = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, cwd=REPO,
                                  env=full_env or {**os.environ, **(env or {})},
                                  start_new_session=True)

    @property
    def pid(self) -> int:
        return self.p.pid

    def kill(self, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)
        self.fh.close()

    def tail(self, n: int = 60) -> str:
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


def start_worker(node: str, gpus: str | None = None, env: dict | None = None) -> Proc:
    argv = [sys.executable, "-m", "workers", "--node", node, "--loglevel", "WARNING"]
    if gpus is not None:
        argv += ["--gpus", gpus]
    return Proc(argv, _HOME / f"worker-{node}-{uuid.uuid4().hex[:6]}.log", env)


def wait_for(pred, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def wait_ready(url: str, proc, timeout: float = 90, what: str = "the service") -> None:
    """Until `url`'s /readyz answers 200; an AssertionError with its log's tail when `proc`
    (a Proc: `.p`, `.tail()`) exits first or the time runs out."""
    def ready():
        if proc.p.poll() is not None:
            raise AssertionError(f"{what} exited:\n" + proc.tail())
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_for(ready, timeout, 0.2, f"{what} to be ready")
    except AssertionError as e:
        if proc.p.poll() is None:
            raise AssertionError(f"{e}\n{proc.tail()}") from None
        raise


class Api:
    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token
        self.c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                              timeout=30)

    def as_(self, token: str) -> "Api":
        return Api(self.url, token)

    def get(self, path, **kw):
        return self.c.get(path, **kw)

    def post(self, path, json=None, **kw):
        return self.c.post(path, json=json, **kw)

    def delete(self, path, **kw):
        return self.c.delete(path, **kw)

    def job(self, job_id: str) -> dict:
        r = self.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_job(self, job_id: str, statuses=("succeeded", "failed", "cancelled"),
                 timeout: float = 60) -> dict:
        return wait_for(lambda: (j := self.job(job_id))["status"] in statuses and j,
                        timeout, 0.2, f"{job_id} to reach {statuses}")

    def submit(self, **body) -> dict:
        r = self.post("/v1/jobs", body)
        assert r.status_code == 201, r.text
        return r.json()


@pytest.fixture(scope="session")
def pg_server(database):
    """A real API process (uvicorn) on the test database."""
    from app.core.db import unit_of_work
    from app.users.service import ensure_admin

    with unit_of_work() as s:
        ensure_admin(s, _HOME)
    port = free_port()
    proc = Proc([sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                _HOME / "api.log")
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_for(ready, 60, 0.2, "the API to be ready")
    except AssertionError:
        raise AssertionError("API did not start:\n" + proc.tail()) from None
    yield url
    proc.kill(signal.SIGTERM)


@pytest.fixture(scope="session")
def pg_api(pg_server) -> Api:
    return Api(pg_server, (_HOME / "admin_token").read_text().strip())


@pytest.fixture(scope="session")
def pg_worker(pg_server):
    """One worker process (node `w1`, no GPUs) for the session."""
    w = start_worker("w1")
    yield w
    w.kill(signal.SIGTERM)


class GpuWorkers:
    """Worker processes of one test, each declaring one GPU (`--gpus 0`); see `gpu_workers`."""

    def __init__(self, api: "Api"):
        self.api = api
        self.procs: dict[str, Proc] = {}

    def start(self, name: str, env: dict | None = None) -> Proc:
        p = self.procs[name] = start_worker(name, "0", env)
        wait_for(lambda: any(n["name"] == name and n["schedulable"] and n["gpus_free"] == 1
                             and n["info"].get("pid") == p.pid
                             for n in self.api.get("/v1/nodes").json()["data"]),
                 60, 0.2, f"node {name} to register")
        return p

    def close(self) -> None:
        from sqlalchemy import update

        from app.core.db import unit_of_work
        from app.models import Node

        for p in self.procs.values():
            p.kill(signal.SIGTERM)
        with unit_of_work() as s:  # also when a stop was not clean: no job goes there again
            s.execute(update(Node).where(Node.name.in_(list(self.procs))).values(alive=False))


@pytest.fixture
def gpu_workers(api):
    """Start workers that declare one GPU each (the session's `w1` declares none, so a job
    asking for a GPU lands on one of these); stopped and marked offline after the test."""
    w = GpuWorkers(api)
    try:
        yield w
    finally:
        w.close()


_user_n = [0]


@pytest.fixture
def member(api) -> Api:
    _user_n[0] += 1
    r = api.post("/v1/users", {"name": f"member{_user_n[0]}-{uuid.uuid4().hex[:4]}",
                               "role": "member"})
    assert r.status_code == 201, r.text
    return api.as_(r.json()["token"])


@pytest.fixture(scope="session")
def pg_home() -> Path:
    return _HOME


# ---- the embedded backend (`draftyard up`: SQLite, the filesystem broker) ---------------------
# The README's first command, and what a one-box team may keep. A module marked
# `pytestmark = pytest.mark.both_backends` runs each of its tests that uses the deployment's
# fixtures (`server`, `api`, `worker`, `home`, `member`, `worker_node`) twice: on the session's
# PostgreSQL + Redis deployment (`[postgres]`) and on one embedded deployment (`[embedded]`),
# so a difference between the backends fails the suite. A test of such a module that cannot
# run embedded says why with `@pytest.mark.postgres_only("...")`; a known difference is
# `@pytest.mark.both_backends(xfail_embedded="...", raises=TheError)` (strict: it fails once
# fixed, so the mark goes; `raises`: any other failure still fails). Every `[embedded]` test
# goes to one xdist group ("embedded"), so a `make test` starts one embedded deployment.
EMBEDDED_GROUP = "embedded"


def pytest_configure(config):
    config.addinivalue_line("markers", "both_backends(xfail_embedded=None, raises=None): run on "
                            "PostgreSQL + Redis and on embedded SQLite + filesystem broker "
                            "(tests/conftest.py)")
    config.addinivalue_line("markers", "postgres_only(reason): in a both_backends module, run "
                            "on the PostgreSQL deployment only")


def pytest_generate_tests(metafunc):
    mark = metafunc.definition.get_closest_marker("both_backends")
    if mark is None or "backend" not in metafunc.fixturenames:
        return
    # Every test of the module that uses the deployment is parametrised, its PostgreSQL-only
    # ones too: an unparametrised one between them would switch the module's `backend` (and
    # the module fixtures built on it) off and on again.
    if metafunc.definition.get_closest_marker("postgres_only"):
        metafunc.parametrize("backend", ["postgres"], indirect=True)
        return
    why = mark.kwargs.get("xfail_embedded")
    xfail = pytest.mark.xfail(strict=True, reason=why, raises=mark.kwargs.get("raises"))
    embedded = pytest.param("embedded", marks=xfail) if why else "embedded"
    metafunc.parametrize("backend", ["postgres", embedded], indirect=True)


@pytest.fixture(scope="session")
def embedded():
    """One embedded deployment for the session (tests/service/stack.py Embedded)."""
    from tests.service.stack import Embedded

    e = Embedded(_HOME / "embedded").start()
    yield e
    e.close()


@pytest.fixture(scope="module")
def backend(request) -> str:
    """Which deployment the test's `server`, `api`, `worker` and `home` are: "postgres"
    unless the module is marked both_backends."""
    return getattr(request, "param", "postgres")


@pytest.fixture(scope="module")
def server(backend, request) -> str:
    """The API's base URL."""
    if backend == "embedded":
        return request.getfixturevalue("embedded").url
    return request.getfixturevalue("pg_server")


@pytest.fixture(scope="module")
def api(backend, request) -> Api:
    if backend == "embedded":
        e = request.getfixturevalue("embedded")
        return Api(e.url, e.token)
    return request.getfixturevalue("pg_api")


@pytest.fixture(scope="module")
def worker(backend, request):
    """The deployment's one CPU worker: the session's `w1` process, or the one `draftyard up`
    started (its own child; None here)."""
    return None if backend == "embedded" else request.getfixturevalue("pg_worker")


@pytest.fixture(scope="module")
def worker_node(backend) -> str:
    """The name of `worker`'s node."""
    from tests.service.stack import Embedded

    return Embedded.node if backend == "embedded" else "w1"


@pytest.fixture(scope="module")
def home(backend, request) -> Path:
    """The deployment's DRAFTYARD_HOME (its data and model roots are data/ and models/)."""
    return request.getfixturevalue("embedded").home if backend == "embedded" else _HOME


def pytest_sessionfinish(session, exitstatus):
    """A passing session takes its home with it (its workers' logs, artifacts and models: up
    to 300 MB each, 8 folders a `make test`, which /tmp kept run after run); a failing one
    keeps it for its logs."""
    if exitstatus == 0:
        shutil.rmtree(_HOME, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """Say loudly when the real fixtures were missing: those tests skip, and a green run
    without them tests much less than it seems."""
    skipped = terminalreporter.stats.get("skipped", [])
    missing = sum(1 for r in skipped if "shared fixtures not found" in str(r.longrepr))
    if missing:
        terminalreporter.write_sep("!", f"{missing} tests SKIPPED: ../shared/fixtures not found "
                                        "(set DRAFTYARD_SHARED_FIXTURES)", red=True, bold=True)


# ---- parallel runs (pytest-xdist, `make test`: -n N --dist loadgroup) -------------------------
# A test module runs whole in one test process, so its module fixtures are built once; a
# module may join a named group instead (`pytestmark = pytest.mark.xdist_group("name")`) when
# it shares a session fixture with other modules (the finished run of `reported_run`).
#
# The groups are handed out in collection order, so the longest go first (the longest first is
# how two test processes finish together; collected alphabetically, the whole-run modules came
# last and one process ran them alone at the end). CPU seconds measured per module; a module
# not listed counts as short.
LONG_FIRST = {
    "tests.service.test_runs": 175, "tests.service.test_demo": 135, "reported_run": 105,
    "tests.stages.test_methods": 125, "tests.stages.test_evaluate_trained": 77,
    "tests.faults.test_faults": 73,
    "tests.service.test_first_day": 68, "tests.stages.test_prepare_token_rows": 65,
    "tests.stages.test_evaluate": 60,
    "tests.service.test_scheduling": 58, "tests.service.test_cli": 50,
    "tests.service.test_generate_kill": 48, "tests.stages.test_generate": 41,
    "tests.stages.test_train": 41, "tests.stages.test_demo_target": 36,
    "tests.service.test_runs_hybrid": 32, EMBEDDED_GROUP: 50,
}


def _group(item) -> str:
    m = item.get_closest_marker("xdist_group")
    return (m.args[0] if m.args else m.kwargs.get("name", "")) if m else ""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if "embedded" in getattr(item, "fixturenames", ()) or \
                (callspec is not None and callspec.params.get("backend") == "embedded"):
            if item.get_closest_marker("xdist_group") is not None:  # xdist would join the names
                raise pytest.UsageError(f"{item.nodeid}: a both_backends module has no "
                                        "xdist_group of its own (its embedded half runs in "
                                        f"{EMBEDDED_GROUP!r})")
            item.add_marker(pytest.mark.xdist_group(EMBEDDED_GROUP))
        elif item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: -LONG_FIRST.get(_group(item), 0))  # stable: order within kept


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """pytest-xdist groups by renaming each test's node id (`...@group`); a pytest that
    ignores the rename (pytest 9 does) would split the groups silently and build each shared
    fixture once per process. Refuse to run like that."""
    if getattr(session.config.option, "loadgroup", False) and session.items \
            and "@" not in session.items[0].nodeid:
        raise pytest.UsageError("pytest-xdist --dist loadgroup did not group the tests (this "
                                f"pytest {pytest.__version__} ignores its node id rename): "
                                "install the versions pyproject.toml pins")
