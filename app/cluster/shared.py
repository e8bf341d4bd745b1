"""The shared folder every node must see.

What lives where, with several machines:
- shared, DRAFTYARD_HOME (one mount on every node and the API): `artifacts/` (published
  outputs; publishing renames into it), `jobs/<id>/` (spec inputs, log, out-<attempt> staging
  renamed into artifacts, and `work/`: what a retry on another node resumes from: finished
  generate shards, extracted samples, train checkpoints), `uploads/`;
- node-local, DRAFTYARD_SCRATCH_DIR (default: under the job's folder): one folder per
  attempt with the stage's spec, its events file (read by the supervisor on the same node
  only) and TMPDIR; nothing a retry needs (workers/runner.py).

The proof: a token in the database (table `deployment`) and the same token in the marker
file `DRAFTYARD_HOME/.draftyard-shared`. The first process to start (the API, or a worker when
none ran yet) creates both; every worker then reads the file back and writes, reads and
removes a probe file in each shared folder before it registers. A node whose folder is a
local one, another deployment's, or read-only refuses to start with a message naming it.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.db import unit_of_work
from app.models import Deployment

log = logging.getLogger("draftyard.cluster")
MARKER = ".draftyard-shared"
KEY = "shared_root"
WAIT_S = 2.0  # the creator writes the file before its row commits; this is for slow mounts


class NotShared(RuntimeError):
    """This process does not see the deployment's shared folder as it must."""


def _token(session: Session) -> tuple[str, bool]:
    """The deployment's token, and whether this call created it."""
    row = session.get(Deployment, KEY)
    if row is not None:
        return row.value, False
    token = secrets.token_hex(16)
    session.add(Deployment(key=KEY, value=token))
    try:
        session.flush()
        return token, True
    except Exception:  # noqa: BLE001  another process created it first: use theirs
        session.rollback()
        return session.scalars(select(Deployment.value).where(Deployment.key == KEY)).one(), \
            False


def _write(path: Path, data: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def ensure_shared(session: Session, s: Settings, who: str, wait_s: float = WAIT_S) -> str:
    """Create or check the marker; then prove each shared folder readable and writable.
    Returns the token. Raises NotShared with what is wrong and what to mount."""
    home = s.home.resolve()
    marker = home / MARKER
    token, created = _token(session)
    if created:
        home.mkdir(parents=True, exist_ok=True)
        _write(marker, token + "\n")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            seen = marker.read_text().strip()
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise NotShared(
                    f"{who}: {home} (DRAFTYARD_HOME) is not the deployment's shared folder: "
                    f"{marker} is missing. Mount the shared volume (artifacts, jobs, uploads) "
                    f"at {home} on this machine, as on the API's") from None
            time.sleep(0.5)
        except OSError as e:
            raise NotShared(f"{who}: cannot read {marker} in the shared folder {home} "
                            f"(DRAFTYARD_HOME): {e}") from None
    if seen != token:
        raise NotShared(f"{who}: {home} (DRAFTYARD_HOME) holds another deployment's shared "
                        f"folder ({marker} does not match this database's token). Mount this "
                        f"deployment's shared volume at {home}")
    for d in (s.artifacts_dir, s.jobs_dir, s.uploads_dir):
        probe = d / f".probe-{secrets.token_hex(6)}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            _write(probe, token)
            ok = probe.read_text() == token
            probe.unlink()
        except OSError as e:
            raise NotShared(f"{who}: cannot write and read back a file in the shared folder "
                            f"{d}: {e}. Mount it read-write") from None
        if not ok:
            raise NotShared(f"{who}: a file written in {d} read back different")
    return token


def announce(s: Settings) -> None:
    """The API at startup: create the marker if this deployment has none yet, and say in the
    log if this API does not see the shared folder (it serves uploads and artifacts from it).
    Never stops the API: it also answers while the database is down."""
    try:
        with unit_of_work() as sess:
            ensure_shared(sess, s, "the API", wait_s=0)
    except NotShared as e:
        log.error("%s", e)
    except Exception as e:  # noqa: BLE001  DB down at startup: workers check when they join
        log.warning("could not check the shared folder at startup: %s", e)
