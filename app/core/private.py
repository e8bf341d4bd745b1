"""What the service writes under DRAFTYARD_HOME (the admin token, the SQLite DB, uploads,
artifacts, job folders and logs) is the team's data: only the OS user running draftyard may
read it. The server (`draftyard up`, `draftyard server`) and every worker call `private_home`
first, so each folder they (and their stages) create is 0700 and each file 0600, whatever the
login shell's umask; a home left readable by an earlier version or by hand is tightened, with
a warning that names it (tests/service/test_embedded.py checks the modes)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("draftyard")

UMASK = 0o077  # group and others get nothing


def private_home(home: Path) -> None:
    """Set the process umask (inherited by every child: the embedded worker, the stages) and
    make an existing `home` 0700. Closing the home is enough for what is already inside it:
    no one else can reach a file in a folder they cannot enter."""
    os.umask(UMASK)
    try:
        mode = stat.S_IMODE(home.stat().st_mode)
    except FileNotFoundError:
        return  # created later under the umask: 0700
    if mode & 0o077:
        home.chmod(0o700)
        log.warning("%s was open to other users of this machine (mode %03o); made it 0700: it "
                    "holds the team's tokens, data and artifacts", home, mode)
