"""`python -m workers --node NAME [--gpus 0,1,...]`: one worker per box (what `draftyard worker`
runs)."""

from __future__ import annotations

import argparse
import logging
import sys


def main() -> None:
    ap = argparse.ArgumentParser(prog="draftyard worker")
    ap.add_argument("--node", default="local")
    ap.add_argument("--gpus", default=None, help="declare GPU indices where none can be detected")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--loglevel", default="INFO")
    a = ap.parse_args()
    logging.basicConfig(level=a.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from app.core.config import get_settings
    from app.core.private import private_home
    from workers.join import CannotJoin
    from workers.node import run_worker

    # Before the first folder or log is made: a stage inherits the umask (app/core/private.py).
    private_home(get_settings().home)

    try:
        run_worker(a.node, a.gpus, a.concurrency, a.loglevel)
    except CannotJoin as e:  # a message naming the mount or address, not a traceback
        logging.getLogger("draftyard.node").error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    main()
