"""A worker node: register its GPUs (detected with nvidia-smi, never by initialising CUDA in
this process, or declared with --gpus), heartbeat, reap and tick the scheduler, and run the
Celery worker that consumes `control`, `cpu` and `gpu.<node>`."""

from __future__ import annotations

import logging
import os
import platform
import signal
import subprocess
import threading
import time


from app.cluster.service import first_live_node, heartbeat, mark_offline, register_node
from app.core.config import get_settings
from app.core.db import unit_of_work
from app.scheduler.nudge import nudge
from app.scheduler.reaper import reap, requeue_node
from app.scheduler.service import lock
from procgroup import PARENT_ENV, group_alive, groups_where
from workers.celery_app import app
from workers.join import check_can_join, check_database
from workers.supervisor import DATA_SERVER, STAGE_SERVER, STOP

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


def kill_orphans(node: str) -> list[int]:
    """Fence before (re-)registration: SIGKILL the process groups of stages that an earlier
    worker incarnation of `node` started on this machine (their jobs are requeued next, so
    nothing of theirs may live on). Returns the groups killed."""
    mine = str(os.getpid())
    # Same node of the same deployment only: another deployment on this machine (its own
    # home and database) may use the same node name.
    same = {k: os.environ.get(k) for k in ("DRAFTYARD_HOME", "DRAFTYARD_DATABASE_URL")}
    killed = []
    for pgid in groups_where(lambda env: env.get("DRAFTYARD_NODE") == node
                             and env.get(PARENT_ENV, mine) != mine
                             and all(env.get(k) == v for k, v in same.items())):
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(group_alive(g) for g in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    if killed:
        log.warning("node %s: killed %d stage process group(s) left by an earlier worker: %s",
                    node, len(killed), killed)
    return killed


def _housekeeping(node: str, stop: threading.Event) -> None:
    """Every tick: heartbeat, and a placement pass (recovers any lost nudge). The first live
    node by name also reaps lost jobs and refreshes queue positions and pending reasons: one
    node is enough, and each refresh reads every waiting job. If it dies, the next one takes
    over once it is stale, which is also when its jobs become reapable."""
    s = get_settings()
    last_reasons, cost = 0.0, 0.0
    while not stop.is_set():
        if STOP.reason:
            # The worker is stopping (workers/supervisor.py request_stop): no new work may be
            # placed here while its stages stop and their jobs are requeued, so no heartbeat
            # marks it alive again.
            try:
                with unit_of_work() as sess:
                    mark_offline(sess, node)
            except Exception:  # run_worker marks it offline again as it exits
                log.exception("could not mark node %s offline", node)
            return
        try:
            with unit_of_work() as sess:
                heartbeat(sess, node)
                leader = first_live_node(sess) == node
            if leader:
                with unit_of_work() as sess:
                    lock(sess)
                    reap(sess)
            t = time.monotonic()
            # At most every second, and at most ~10% of the time on a long queue.
            if leader and t - last_reasons >= max(1.0, 10 * cost):
                nudge(with_reasons=True)
                last_reasons, cost = t, time.monotonic() - t
            else:
                nudge()
        except Exception:  # keep heartbeating through DB blips
            log.exception("housekeeping tick failed")
        stop.wait(min(1.0, s.heartbeat_s))


def run_worker(node: str, gpus_decl: str | None, concurrency: int | None = None,
               loglevel: str = "INFO") -> None:
    os.environ["DRAFTYARD_NODE"] = node
    s = get_settings()
    gpus = parse_gpus(gpus_decl)
    if gpus is None:
        gpus = detect_gpus()
    check_database(node)  # refuses to start (a message, exit 2) without the database
    kill_orphans(node)
    with unit_of_work() as sess:
        # An earlier incarnation's jobs are dead (killed just above): requeue them now,
        # not after their heartbeats age (recovery within 60 s), and before the
        # slower join checks below.
        moved = requeue_node(sess, node)
    check_can_join(node)  # broker, shared folder: refuses to start (exit 2) without them
    with unit_of_work() as sess:
        register_node(sess, node, gpus, hostname=platform.node(), cpu_slots=s.cpu_slots,
                      info={"pid": os.getpid(), "declared": gpus_decl is not None})
    if moved:
        log.warning("node %s: requeued %d job(s) of an earlier worker: %s", node, len(moved),
                    moved)
        nudge()
    log.info("node %s registered with %d GPUs", node, len(gpus))
    if s.cpu_slots > 0 and s.stage_server:
        # The data stages' warm starter, now rather than with the first of them (whose wall
        # would take its ~0.6 s start): CPU jobs are this box's daily bread.
        DATA_SERVER.warm_up()
    if s.stage_server and s.stage_warm_up:
        STAGE_SERVER.warm_up()
    stop = threading.Event()
    keeper = threading.Thread(target=_housekeeping, args=(node, stop), daemon=True,
                              name="housekeeping")
    keeper.start()
    conc = concurrency or (len(gpus) + s.cpu_slots + 1)
    # DRAFTYARD_CPU_SLOTS=0: a box kept for GPU stages takes no CPU job (README "Add a machine").
    queues = ",".join(["control", *(["cpu"] if s.cpu_slots > 0 else []), f"gpu.{node}"])
    argv = ["worker", "-Q", queues, "--pool", "threads", "-c", str(conc),
            "-n", f"{node}@{platform.node()}-{os.getpid()}", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "-l", loglevel]
    try:
        app.worker_main(argv)
    finally:
        stop.set()
        keeper.join(10)  # its last heartbeat must not land after the offline mark
        try:
            with unit_of_work() as sess:
                mark_offline(sess, node)
        except Exception:  # the reaper marks it dead after stale_after_s anyway
            log.exception("could not mark node %s offline", node)

