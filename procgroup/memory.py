"""What a stage's processes held in memory, and what the node had, as /proc shows them: the
figures a job's error carries when its stage died by a signal nobody of ours sent (the
kernel's out-of-memory killer sends SIGKILL and leaves no word in the stage's own log).

A process's VmHWM is its resident high-water mark: the kernel keeps it up to the moment the
process dies, but it dies with the process, so the supervisor samples it while the stage runs
(`PeakMemory.sample`, every round of its watch loop: one small read per process, ~30 us).
The attempt's processes are found by its tag (procgroup.tagged; a scan of every process's
environment, ~2 ms with 100 processes on the box, so every few seconds): torchrun's ranks and a
vLLM engine live outside the stage's process group. Standard library only (procgroup's rule).
"""

from __future__ import annotations

import time
from pathlib import Path

from procgroup import tagged


def _fields(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """`Key:  N kB` lines of a /proc file, in bytes (those of `keys` present)."""
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out  # gone while we looked, or no /proc
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in keys:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def high_water(pid: int) -> int | None:
    """A live process's VmHWM in bytes, or None (gone, a zombie, or no /proc)."""
    return _fields(f"/proc/{pid}/status", ("VmHWM",)).get("VmHWM")


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed on this node since boot
    (/proc/vmstat `oom_kill`, Linux >= 4.13; a cgroup's limit counts too), or None."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def node_memory() -> dict[str, int | None]:
    """This node's memory now: total and available bytes (/proc/meminfo) and its OOM kills."""
    f = _fields("/proc/meminfo", ("MemTotal", "MemAvailable"))
    return {"total_bytes": f.get("MemTotal"), "available_bytes": f.get("MemAvailable"),
            "oom_kills": oom_kills()}


class PeakMemory:
    """The peak memory of one attempt's processes: at each sample, the sum of the VmHWM of
    every live process of the attempt; the largest such sum seen. For a stage of one process
    that is its own high-water mark up to the last sample; for several, an upper bound of
    what they held at once (each one's peak may have come at a different time). The set of
    processes is rescanned from their tag every `rescan_s` (a read of every process's
    environment); the stage's leader is sampled every time."""

    def __init__(self, tag: str, rescan_s: float = 5.0):
        self.tag = tag
        self.rescan_s = rescan_s
        self.peak_bytes: int | None = None
        self.processes = 0  # the most processes counted in one sample
        self._pids: set[int] = set()
        self._scanned = float("-inf")
        self.oom_kills_before = oom_kills()

    def sample(self, leader: int | None) -> None:
        now = time.monotonic()
        if now - self._scanned >= self.rescan_s:
            self._pids = set(tagged(self.tag))
            self._scanned = now
        if leader is not None:
            self._pids.add(leader)
        total, live = 0, set()
        for pid in self._pids:
            hwm = high_water(pid)
            if hwm is not None:
                total += hwm
                live.add(pid)
        self._pids = live
        if live and (self.peak_bytes is None or total > self.peak_bytes):
            self.peak_bytes = total
        self.processes = max(self.processes, len(live))

    def report(self) -> dict:
        """The figures for a job's error: this attempt's peak, the node's memory now, and
        whether the OOM killer killed anything on the node while the stage ran."""
        node = node_memory()
        before, after = self.oom_kills_before, node.get("oom_kills")
        return {"peak_bytes": self.peak_bytes, "processes": self.processes,
                "node_total_bytes": node["total_bytes"],
                "node_available_bytes": node["available_bytes"],
                "oom_kills_meanwhile": None if before is None or after is None
                else after - before}


def mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.0f} MiB"
