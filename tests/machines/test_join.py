"""A node joins only if it can work. A worker that does not see the deployment's
shared folder (its DRAFTYARD_HOME is a local folder), or cannot reach the database or the
broker, refuses to start with a message naming the mount or the address, and never
registers. On main it registered and took work it could not do (a wrong folder, no broker)
or died with a traceback (no database)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from app.cluster.shared import MARKER
from tests.conftest import free_port, start_worker, wait_for


def _refused(api, node: str, env: dict) -> str:
    w = start_worker(node, env=env)
    try:
        wait_for(lambda: w.p.poll() is not None, 60, 0.2, f"worker {node} to refuse")
        out = w.tail(40)
        assert w.p.returncode == 2, (w.p.returncode, out)
        assert "Traceback" not in out, out
        assert node not in {n["name"] for n in api.get("/v1/nodes").json()["data"]}
        return out
    finally:
        w.kill()


def test_marker_written_by_api(api, home):
    assert (home / MARKER).read_text().strip()


def test_local_folder_instead_of_shared_mount(api):
    local = Path(tempfile.mkdtemp(prefix="draftyard-notshared-"))
    out = _refused(api, "nomount", {"DRAFTYARD_HOME": str(local)})
    assert f"{local} (DRAFTYARD_HOME) is not the deployment's shared folder" in out, out
    assert f"Mount the shared volume (artifacts, jobs, uploads) at {local}" in out, out


def test_other_deployments_folder(api):
    other = Path(tempfile.mkdtemp(prefix="draftyard-other-"))
    (other / MARKER).write_text("0123456789abcdef\n")
    out = _refused(api, "otherdep", {"DRAFTYARD_HOME": str(other)})
    assert "holds another deployment's shared folder" in out, out


def test_database_unreachable(api):
    port = free_port()
    out = _refused(api, "nodb", {"DRAFTYARD_DATABASE_URL":
                                 f"postgresql+psycopg://postgres:pw@127.0.0.1:{port}/x"})
    assert f"the database at 127.0.0.1:{port} (DRAFTYARD_DATABASE_URL) does not answer" in out
    assert ":pw@" not in out, out  # never the password


def test_broker_unreachable(api):
    port = free_port()
    out = _refused(api, "nobroker", {"DRAFTYARD_BROKER_URL": f"redis://127.0.0.1:{port}/0"})
    assert f"the broker at 127.0.0.1:{port} (DRAFTYARD_BROKER_URL) does not answer" in out, out
