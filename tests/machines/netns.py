"""Two worker machines on this host: network namespaces A and B, each joined to the
root namespace by a veth pair of its own, where PostgreSQL, Redis and the API run. The same
layout as docker-compose.yml and README "Add a machine":

    root namespace: PostgreSQL and Redis of the test's own, listening on 127.0.0.1 and on the
                    host end of each veth (10.X.1.1, 10.X.2.1); the API on 127.0.0.1
    machine a:      10.X.1.2, reaches them at 10.X.1.1; scratch `scratch-a`
    machine b:      10.X.2.2, reaches them at 10.X.2.1; scratch `scratch-b`
    shared folder:  `shared` (DRAFTYARD_HOME of the API and both workers)

Each worker runs in its namespace and in a mount namespace of its own in which the other
machine's scratch folder is covered by an empty tmpfs: node-local scratch that the other
cannot see. /proc is shared, so one sampler sees the stages of both machines.

Root only: `require_netns()` skips with the reason elsewhere. Everything created is removed
by `close()` (the fixture calls it whatever the test did)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.faults.harness import StageSampler
from tests.service.stack import REPO, Stack, _Proc
from tests.services import LocalPostgres, LocalRedis

MACHINES = ("a", "b")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_netns() -> None:
    """Skip (with the reason) unless this process can create network namespaces."""
    if os.geteuid() != 0:
        pytest.skip("the machines tests need root (ip netns add, veth pairs)")
    if shutil.which("ip") is None:
        pytest.skip("the machines tests need iproute2's `ip`")
    probe = f"dyprobe{secrets.token_hex(3)}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        pytest.skip(f"`ip netns add` failed here: {r.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


class Net:
    """Namespaces dy<id>a / dy<id>b, veth pairs dy<id>a0 (root end) <-> dy<id>a1."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(2)
        self.octet = 100 + secrets.randbelow(100)
        self.made_ns: list[str] = []
        self.made_links: list[str] = []

    def ns(self, m: str) -> str:
        return f"dy{self.id}{m}"

    def host_addr(self, m: str) -> str:
        """The root namespace's address as machine m reaches it."""
        return f"10.{self.octet}.{MACHINES.index(m) + 1}.1"

    def addr(self, m: str) -> str:
        return f"10.{self.octet}.{MACHINES.index(m) + 1}.2"

    @property
    def network(self) -> str:
        return f"10.{self.octet}.0.0/16"

    def link(self, m: str) -> str:
        """Machine m's end of its veth (inside its namespace)."""
        return f"dy{self.id}{m}1"

    def up(self) -> "Net":
        for m in MACHINES:
            ns, root_end, ns_end = self.ns(m), f"dy{self.id}{m}0", self.link(m)
            _ip("netns", "add", ns)
            self.made_ns.append(ns)
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            self.made_links.append(root_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("addr", "add", f"{self.host_addr(m)}/24", "dev", root_end)
            _ip("link", "set", root_end, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{self.addr(m)}/24", "dev", ns_end)
            _ip("netns", "exec", ns, "ip", "link", "set", ns_end, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return self

    def cut(self, m: str) -> None:
        """Machine m's link down, from inside its namespace: a partition."""
        _ip("netns", "exec", self.ns(m), "ip", "link", "set", self.link(m), "down")

    def restore(self, m: str) -> None:
        _ip("netns", "exec", self.ns(m), "ip", "link", "set", self.link(m), "up")

    def close(self) -> None:
        for ns in self.made_ns:  # deleting a namespace deletes its veth end and the pair
            _ip("netns", "del", ns, check=False)
        for link in self.made_links:
            _ip("link", "del", link, check=False)


class Machines:
    """The deployment of the module docstring."""

    def __init__(self, settings: dict[str, str] | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="draftyard-machines-"))
        self.root.chmod(0o755)
        self.shared = self.root / "shared"
        self.scratch = {m: self.root / f"scratch-{m}" for m in MACHINES}
        self.net = Net()
        self.pg: LocalPostgres | None = None
        self.redis: LocalRedis | None = None
        self.stack: Stack | None = None
        self.sampler: StageSampler | None = None
        self.workers: dict[str, _Proc] = {}
        self.settings = {"DRAFTYARD_STALE_AFTER_S": "6", "DRAFTYARD_HEARTBEAT_S": "0.5",
                         "DRAFTYARD_CANCEL_GRACE_S": "2",
                         "DRAFTYARD_DATA_ROOTS": str(self.shared / "data"),
                         "DRAFTYARD_MODEL_ROOTS": str(self.shared / "models"),
                         **(settings or {})}

    def up(self) -> "Machines":
        self.net.up()
        hosts = tuple(self.net.host_addr(m) for m in MACHINES)
        self.pg = LocalPostgres(self.root / "pg", listen=hosts, trust=(self.net.network,))
        self.redis = LocalRedis(self.root / "redis", listen=hosts)
        self.pg.start()
        self.redis.start()
        for d in (self.shared / "data", self.shared / "models", *self.scratch.values()):
            d.mkdir(parents=True, exist_ok=True)
        self.stack = Stack("machines", 0, self.settings, pg_admin=f"{self.pg.url}/test",
                           redis_base=self.redis.url, home=self.shared).create()
        self.stack.start_api()
        self.sampler = StageSampler(self.shared).start()
        return self

    def worker_env(self, m: str) -> dict[str, str]:
        """What machine m's worker is configured with: the addresses it reaches the
        database and broker at, its own scratch folder."""
        host = self.net.host_addr(m)
        return {"DRAFTYARD_DATABASE_URL": self.stack.db_url.replace("127.0.0.1", host),
                "DRAFTYARD_BROKER_URL": self.stack.redis_url.replace("127.0.0.1", host),
                "DRAFTYARD_SCRATCH_DIR": str(self.scratch[m])}

    def start_worker(self, m: str, gpus: str | None = "0",
                     env: dict[str, str] | None = None) -> _Proc:
        other = [str(self.scratch[o]) for o in MACHINES if o != m]
        cmd = [sys.executable, "-m", "workers", "--node", m, "--loglevel", "WARNING"]
        if gpus is not None:
            cmd += ["--gpus", gpus]
        # The other machine's scratch is not there on this one: an empty tmpfs over it.
        hide = " && ".join(f"mount -t tmpfs -o size=1m tmpfs '{o}'" for o in other)
        argv = ["ip", "netns", "exec", self.net.ns(m), "unshare", "--mount",
                "--propagation", "private", "sh", "-c",
                f"{hide} && cd '{REPO}' && exec " + " ".join(f"'{a}'" for a in cmd)]
        p = _Proc(argv, self.shared / f"worker-{m}.log",
                  {**self.stack.env, **self.worker_env(m), **(env or {})})
        self.stack.procs.append(p)
        self.workers[m] = p
        return p

    def client(self):
        return self.stack.client()

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        try:
            if self.stack is not None:
                for p in reversed(self.stack.procs):
                    p.kill()
                self.stack.procs.clear()
        finally:
            for srv in (self.pg, self.redis):
                if srv is not None:
                    try:
                        srv.stop()
                    except Exception:  # noqa: BLE001  the rest must still go
                        pass
            self.net.close()
            keep = os.environ.get("DRAFTYARD_MACHINES_LOGS")  # where to keep the logs
            if keep:
                dest = Path(keep) / self.root.name
                dest.mkdir(parents=True, exist_ok=True)
                for f in self.shared.glob("*.log"):
                    shutil.copy(f, dest / f.name)
            shutil.rmtree(self.root, ignore_errors=True)
