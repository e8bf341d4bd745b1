"""A worker's warm starters (workers/stages/starter.py, profiles `model` and `data`) on real
processes: a
stage it forks shows its attempt's tag, its job id and its command line in /proc like a
freshly started one (procgroup.set_proc_environ, set_proc_cmdline), is the process
`python -m workers.stages` would be (the request's environment, the log), and dies, with the
server, when the worker is SIGKILLed. The whole path under a real worker is
tests/service (every model stage of the suite is forked warm) and, with torchrun's ranks,
tests/stages/test_train_contained.py's `warm` cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from procgroup import TAG_ENV, _environ, job_tag, tagged
from tests.conftest import REPO, wait_for
from tests.stages.conftest import shared_fixtures

DEPLOYMENT = "starter-test"

# A stand-in worker: the supervisor's own starter and AttemptProcesses; it prints the stage's pid, the
# server's pid and how the stage was started, then waits for the stage.
WORKER = """
import os, sys
from pathlib import Path
from procgroup import AttemptProcesses
from workers.supervisor import DATA_SERVER, STAGE_SERVER
from workers.stages.starter import DATA_STAGES
job, spec, stage = sys.argv[1:4]
a = AttemptProcesses("starter-test", job, 1)
log = Path(spec).parent / "log.txt"
SERVER = DATA_SERVER if stage in DATA_STAGES else STAGE_SERVER

def warm(env):
    return SERVER.start({"stage": stage, "spec": spec, "cwd": str(Path(spec).parent),
                               "log": str(log), "env": env,
                               "proc_env": {"DRAFTYARD_ATTEMPT": a.tag, "DRAFTYARD_JOB_ID": job}})

p = a.start([sys.executable, "-m", "workers.stages", stage, "--spec", spec],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "3"}, log=log, warm=warm)
print(p.pid, SERVER.server_pid, type(p).__name__, flush=True)
print(p.wait(), flush=True)
a.sweep()
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _worker(tmp_path: Path, job: str, spec: Path, stage: str = "train") -> subprocess.Popen:
    env = {**os.environ, "DRAFTYARD_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WORKER, job, str(spec), stage], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)


def test_a_forked_stage_carries_its_tag_and_dies_with_its_worker(tmp_path):
    # A spec nobody writes (a FIFO): the stage blocks reading it, tagged, until it is killed.
    spec = tmp_path / "spec.json"
    os.mkfifo(spec)
    worker = _worker(tmp_path, "job-a", spec)
    try:
        pid, server, kind = worker.stdout.readline().split()
        pid, server = int(pid), int(server)
        assert kind == "WarmChild"
        tag = job_tag(DEPLOYMENT, "job-a") + "1"
        # The forked stage is found by its tag (the server itself carries none), and /proc
        # shows its job and its command line as of a fresh stage.
        wait_for(lambda: tagged(tag) == [pid], 10, 0.05, "the forked stage to carry its tag")
        assert (_environ(pid) or {}).get("DRAFTYARD_JOB_ID") == "job-a"
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert argv[1:] == [b"-m", b"workers.stages", b"train", b"--spec", str(spec).encode()]
        assert (_environ(server) or {}).get(TAG_ENV, "").startswith("unassigned")
        assert os.getpgid(pid) == pid  # a group of its own: a stop reaches what it starts
        os.killpg(worker.pid, signal.SIGKILL)
        # The server sees its worker gone, and the stage goes with it.
        wait_for(lambda: not _alive(server) and not _alive(pid) and not tagged(tag), 10, 0.05,
                 "the server and the stage to die with the worker")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def test_the_environment_a_forked_stage_sees(tmp_path):
    """What a stage reads from its environment is the request's, not the server's: a child
    that prints its view (os.environ, /proc/self/environ's tag, TMPDIR) through the server's
    own fork path (Server.start / _child) with a stand-in stage command."""
    code = r"""
import json, os, socket, sys, tempfile
sys.path.insert(0, sys.argv[1])
from workers.stages import starter
from procgroup import TAG_ENV, _environ
# The child's stage is replaced by a report of what it sees.
def fake_main(argv, watch=True):
    print(json.dumps({"argv": argv, "watch": watch, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "tag": os.environ.get(TAG_ENV), "proc_tag": _environ("self").get(TAG_ENV),
                      "proc_job": _environ("self").get("DRAFTYARD_JOB_ID"),
                      "tmp": tempfile.gettempdir()}))
    return 0
import workers.stages.__main__ as m
m.main = fake_main
tempfile.gettempdir()  # cached in the server: the child must read TMPDIR again
srv = starter.Server(starter.Path(sys.argv[2]), os.getppid(), "model")
assert srv.can_tag
lst = srv.listen()
a, b = socket.socketpair()
req = {"stage": "train", "spec": "/x/spec.json", "cwd": sys.argv[3], "log": sys.argv[4],
       "env": {"CUDA_VISIBLE_DEVICES": "5", TAG_ENV: "abc/job/1", "TMPDIR": sys.argv[3]},
       "proc_env": {TAG_ENV: "abc/job/1", "DRAFTYARD_JOB_ID": "job"}}
assert srv._check(req) is None
# A name the server's own block has would show twice: declined (the caller starts fresh).
assert "cannot show" in srv._check({**req, "proc_env": {TAG_ENV: "t", "PATH": "/x"}})
assert "cannot show" in srv._check({**req, "proc_env": {TAG_ENV: "t" * 600}})
pid = starter.fork_child()
if pid == 0:
    starter._child(a, lst, req)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    from procgroup import TAG_SLOT

    env = {**os.environ, TAG_ENV: TAG_SLOT, "PYTHONPATH": str(REPO)}
    log = tmp_path / "log.txt"
    out = subprocess.run([sys.executable, "-c", code, str(REPO), str(tmp_path / "s.sock"),
                          str(tmp_path), str(log)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr[-2000:]
    seen = json.loads(log.read_text().strip().splitlines()[-1])
    assert seen == {"argv": ["train", "--spec", "/x/spec.json"], "watch": False, "cvd": "5",
                    "tag": "abc/job/1", "proc_tag": "abc/job/1", "proc_job": "job",
                    "tmp": str(tmp_path)}


def test_a_forked_ingest_gives_what_a_fresh_one_gives(tmp_path):
    """The data profile: ingest forked from the warm server (pyarrow, pandas and the stage
    imported there, its allocators set before) writes the artifact a fresh process writes."""
    datasets_dir = shared_fixtures() / "datasets"
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(b"".join((datasets_dir / f).read_bytes() for f in
                             ("alpaca.jsonl", "sharegpt.jsonl", "openai_messages.jsonl")) * 5
                    + b"{broken\n")
    outs = {}
    for how in ("warm", "fresh"):
        job = tmp_path / how
        job.mkdir()
        spec = job / "spec.json"
        spec.write_text(json.dumps({"type": "ingest", "inputs": {"source": {"path": str(src)}},
                                    "params": {}, "out_dir": str(job / "out"),
                                    "work_dir": str(job / "work"),
                                    "events_path": str(job / "events.jsonl")}))
        if how == "warm":
            worker = _worker(tmp_path, "job-ingest", spec, "ingest")
            out, _ = worker.communicate(timeout=120)
            pid, server, kind, rc = out.split()
            assert (kind, rc) == ("WarmChild", "0") and server != "None"
        else:
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            subprocess.run([sys.executable, "-m", "workers.stages", "ingest", "--spec",
                            str(spec)], cwd=REPO, env=env, check=True, timeout=120)
        art = job / "out" / "dataset"
        outs[how] = [(art / f).read_bytes() for f in ("rejects.jsonl", "meta.json")] + [
            pq.read_table(art / "data.parquet").to_pylist()]
    assert outs["warm"] == outs["fresh"]
