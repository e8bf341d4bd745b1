"""`probe`: report what a node gives a stage (python, torch, CUDA, visible devices, free disk).
`sleep_s` makes it wait (with progress) and `fail` makes it fail on purpose: for operators
checking a node, and for tests of the job plumbing. `import_torch: false` skips the torch
import (and so the device list): a probe then starts in a fraction of a second, which is what
scheduler tests running hundreds of them need."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time

from contracts.probe import ProbeParams
from contracts.resolved import ProbeResolved
from workers.stages.common import StageContext, StageError


def _torch_facts() -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "devices": [{"index": i, "name": torch.cuda.get_device_name(i),
                         "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
                        for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else []}


def run(p: ProbeParams, inputs: ProbeResolved, ctx: StageContext) -> dict:
    sleep_s, steps = p.sleep_s, p.steps
    facts: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpu_count": os.cpu_count(),
        "disk_free_bytes": shutil.disk_usage(ctx.out_dir).free,
    }
    if not p.import_torch:
        facts["torch"] = "not imported (params.import_torch=false)"
    else:
        facts.update(_torch_facts())
    print(f"probe facts: {facts}", flush=True)
    for i in range(steps):
        if sleep_s:
            time.sleep(sleep_s / steps)
        ctx.progress(i + 1, steps, "steps", stage="probe", force=True)
        ctx.metric(i + 1, tick=float(i + 1))
    if p.fail:
        raise StageError("probe_failed", "the probe was asked to fail (params.fail=true)")
    return facts
