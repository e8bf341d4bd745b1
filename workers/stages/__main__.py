"""Run one stage alone: `python -m workers.stages <type> --spec spec.json`.

Exit status: 0 success, 2 typed failure (an `error` event was written), 1 crash.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import traceback

from pydantic import ValidationError

from contracts.jobtypes import STREAMING_STAGES
from contracts.spec import StageSpec
from procgroup import watch_parent
from workers.stages.common import StageContext, StageError, read_spec
from workers.stages.entry import STAGES, call
from workers.stages.memory import lean_allocators
from workers.stages.threads import apply_stage_threads

__all__ = ["STAGES", "main"]


def _sigterm(signum, frame):
    # Turn SIGTERM into an exception so stages unwind through their finally blocks
    # (stop a vLLM server, flush a checkpoint) before the supervisor's SIGKILL.
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None, watch: bool = True) -> int:
    """`watch`: die with the supervising worker (procgroup.watch_parent); a warm starter's
    child (workers/stages/starter.py) is tied to its server instead."""
    ap = argparse.ArgumentParser(prog="python -m workers.stages")
    ap.add_argument("type", choices=STAGES)
    ap.add_argument("--spec", required=True, help="path to the job's spec.json")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    if watch:
        watch_parent()

    try:
        spec = StageSpec.model_validate(read_spec(args.spec)).model_dump(mode="json")
    except ValidationError as e:
        err = e.errors()[0]
        print(f"error [bad_spec]: {args.spec}: {'.'.join(map(str, err['loc']))}: "
              f"{err['msg']}", file=sys.stderr)
        return 2
    if spec["type"] not in (None, args.type):
        print(f"error [bad_spec]: {args.spec} is a {spec['type']} spec, not {args.type}",
              file=sys.stderr)
        return 2
    spec["type"] = args.type
    if args.type in STREAMING_STAGES:
        lean_allocators(args.type)  # before the stage imports pyarrow
    apply_stage_threads()  # before the stage's first forward (workers/stages/threads.py)
    ctx = StageContext.from_spec(spec)
    try:
        result = call(args.type, spec, ctx)  # typed params and inputs (workers/stages/entry.py)
        ctx.emit("result", result)
        return 0
    except StageError as e:
        ctx.emit("error", {"code": e.code, "message": e.message, "details": e.details})
        print(f"error [{e.code}]: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stage interrupted (SIGTERM)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001  a crash: the log keeps the traceback
        traceback.print_exc()
        # A full disk is the operator's to fix, not a bug of the stage: say so.
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        ctx.emit("error", {"code": "disk_full" if full else "stage_crashed",
                           "message": ("no space left on the server's disk; free space, then "
                                       "retry the job: " if full else "")
                           + f"{type(e).__name__}: {e}"[:2000], "details": None})
        return 1
    finally:
        ctx.close()
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
