"""The tiny run inputs many service tests share: a tiny random Qwen3 registered as a target,
and chat records it learns in a few steps ("count to i" -> "0 1 2 ...")."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

from tests.conftest import Api, wait_for

_BUILT: dict[tuple, Path] = {}  # build_tiny_target's arguments -> the one build of them


def counting_records(n: int) -> list[dict]:
    """`n` user/assistant records whose answers a tiny drafter learns fast."""
    return [{"messages": [{"role": "user", "content": f"count to {i}"},
                          {"role": "assistant",
                           "content": " ".join(str(k) for k in range(i % 7 + 5))}]}
            for i in range(n)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def tiny_model(out_dir: Path, **kw) -> Path:
    """`build_tiny_target(out_dir, **kw)`'s files, built once per test process for the same
    arguments and copied: a build is ~1 CPU-s (the tokenizer, a seeded random init, 50 MB
    written) and the service tests build the same target a dozen times; the files are the
    same byte for byte (seeded, and nothing in them names their folder). A copy, not a link:
    a test may change its target's files."""
    from workers.stages.tinymodel import build_tiny_target

    key = tuple(sorted(kw.items()))
    if key not in _BUILT:
        tmp = Path(tempfile.mkdtemp(prefix="draftyard-tiny-"))
        atexit.register(shutil.rmtree, tmp, True)
        _BUILT[key] = build_tiny_target(tmp / "model", **kw)
    shutil.copytree(_BUILT[key], out_dir, dirs_exist_ok=True)
    return Path(out_dir)


def tiny_target(api: Api, home: Path, name: str, **body) -> dict:
    """A tiny random Qwen3 (8 layers, hidden 64, the real Qwen3 tokenizer) under the model
    roots, registered as `name` (extra target fields in `body`)."""
    d = tiny_model(home / "models" / f"tiny-{name}", arch="qwen3")
    r = api.post("/v1/targets", {"name": name, "path": str(d), **body})
    assert r.status_code == 201, r.text
    return r.json()


def ingested(api: Api, path: Path, name: str, timeout: float = 300) -> dict:
    """The dataset registered from `path` (inside the data roots), once its ingest ended."""
    r = api.post("/v1/datasets", {"name": name, "path": str(path)})
    assert r.status_code == 201, r.text
    ds_id = r.json()["id"]
    return wait_for(lambda: (x := api.get(f"/v1/datasets/{ds_id}").json())["status"]
                    != "ingesting" and x, timeout, 0.3, f"ingest of {name}")
