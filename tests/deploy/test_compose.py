"""docker-compose.yml and Dockerfile cannot run here (no Docker engine); check their shape."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_compose_has_the_box():
    c = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    svc = c["services"]
    assert set(svc) >= {"postgres", "redis", "migrate", "api", "worker"}
    assert svc["migrate"]["command"] == ["draftyard", "migrate"]
    assert svc["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    gpu = svc["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["count"] == "all" and "gpu" in gpu["capabilities"]
    env = svc["api"]["environment"]
    assert env["DRAFTYARD_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["DRAFTYARD_BROKER_URL"].startswith("redis://")
    # Every command the compose file runs is a real CLI command.
    from typer.main import get_command

    from app.cli.main import cli

    names = set(get_command(cli).commands)
    for s in ("migrate", "api", "worker"):
        assert svc[s]["command"][1] in names


def test_dockerfile_installs_the_package_and_runs_the_server():
    text = (REPO / "Dockerfile").read_text()
    assert "pip install" in text and "COPY migrations" in text
    assert 'CMD ["draftyard", "server"' in text
    # every package the wheel ships is in the image (a new top-level package is easy to miss)
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    for pkg in include:
        assert f"COPY {pkg.rstrip('*')} ./{pkg.rstrip('*')}" in text, pkg


@pytest.mark.skipif(not shutil.which("docker"), reason="no docker client")
def test_docker_compose_config_validates():
    r = subprocess.run(["docker", "compose", "config", "-q"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0 and ("is not a docker command" in r.stderr or "unknown" in r.stderr.lower()):
        pytest.skip("docker compose plugin not available")
    assert r.returncode == 0, r.stderr


def test_compose_second_machine_layout():
    """The layout of tests/machines/ (README "Add a machine"): two worker services,
    each with a scratch volume of its own (DRAFTYARD_SCRATCH_DIR), one shared volume at
    DRAFTYARD_HOME for the API and both workers; DB and broker addresses settable for a
    worker on another machine, and published to it only when asked."""
    c = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    svc, vols = c["services"], c["volumes"]
    workers = [svc["worker"], svc["worker-2"]]
    assert svc["worker-2"]["profiles"] == ["second-machine"]
    assert "depends_on" not in svc["worker-2"]  # its DB and broker are the first box's
    mounts = [dict(reversed(v.split(":")[:2]) for v in w["volumes"]) for w in workers]
    home = svc["api"]["environment"]["DRAFTYARD_HOME"]
    assert {m[home] for m in mounts} == {"shared"}
    assert dict(reversed(v.split(":")[:2]) for v in svc["api"]["volumes"])[home] == "shared"
    scratch = [w["environment"]["DRAFTYARD_SCRATCH_DIR"] for w in workers]
    assert scratch == ["/scratch", "/scratch"]
    assert mounts[0]["/scratch"] != mounts[1]["/scratch"]
    assert {mounts[0]["/scratch"], mounts[1]["/scratch"], "shared"} <= set(vols)
    assert vols["shared"]["driver_opts"]["device"].startswith("${SHARED_DIR")
    nodes = [w["command"][w["command"].index("--node") + 1] for w in workers]
    assert nodes[0] != nodes[1]
    env = workers[1]["environment"]
    assert "${DB_HOST:-postgres}" in env["DRAFTYARD_DATABASE_URL"]
    assert "${BROKER_HOST:-redis}" in env["DRAFTYARD_BROKER_URL"]
    for s in ("postgres", "redis"):
        assert all(p.startswith("${PUBLISH_ADDR:-127.0.0.1}:") for p in svc[s]["ports"])
