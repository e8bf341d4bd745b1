"""A worker node: register its GPUs (detected with nvidia-smi, never by initialising CUDA in
this process, or declared with --gpus), heartbeat, reap and tick the scheduler, and run the
Celery worker that consumes `control`, `cpu` and `gpu.<node>`."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import threading


from app.cluster.service import heartbeat, register_node
from app.core.config import get_settings
from app.core.db import unit_of_work

log = logging.getLogger("draftyard.node")


def detect_gpus() -> list[dict]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        idx, name, mem = [x.strip() for x in line.split(",")]
        gpus.append({"index": int(idx), "name": name, "memory_bytes": int(float(mem)) * 1024**2})
    return gpus


def parse_gpus(spec: str | None) -> list[dict] | None:
    if spec is None or spec == "":
        return None
    return [{"index": int(i), "name": "declared", "memory_bytes": None}
            for i in spec.split(",") if i.strip()]


def _housekeeping(node: str, stop: threading.Event) -> None:
    from app.scheduler.nudge import nudge
    from app.scheduler.reaper import reap
    from app.scheduler.service import lock

    s = get_settings()
    while not stop.is_set():
        try:
            with unit_of_work() as sess:
                heartbeat(sess, node)
            with unit_of_work() as sess:
                lock(sess)
                reap(sess)
            nudge()
        except Exception:  # noqa: BLE001  keep heartbeating through DB blips
            log.exception("housekeeping tick failed")
        stop.wait(min(1.0, s.heartbeat_s))


def run_worker(node: str, gpus_decl: str | None, concurrency: int | None = None,
               loglevel: str = "INFO") -> None:
    os.environ["DRAFTYARD_NODE"] = node
    s = get_settings()
    gpus = parse_gpus(gpus_decl)
    if gpus is None:
        gpus = detect_gpus()
    with unit_of_work() as sess:
        register_node(sess, node, gpus, hostname=platform.node(), cpu_slots=s.cpu_slots,
                      info={"pid": os.getpid(), "declared": gpus_decl is not None})
    log.info("node %s registered with %d GPUs", node, len(gpus))
    stop = threading.Event()
    threading.Thread(target=_housekeeping, args=(node, stop), daemon=True,
                     name="housekeeping").start()
    from workers.celery_app import app

    conc = concurrency or (len(gpus) + s.cpu_slots + 1)
    argv = ["worker", "-Q", f"control,cpu,gpu.{node}", "--pool", "threads", "-c", str(conc),
            "-n", f"{node}@{platform.node()}-{os.getpid()}", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "-l", loglevel]
    try:
        app.worker_main(argv)
    finally:
        stop.set()

