"""The tiny run inputs many service tests share: a tiny random Qwen3 registered as a target,
and chat records it learns in a few steps ("count to i" -> "0 1 2 ...")."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Api, wait_for


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


def tiny_target(api: Api, home: Path, name: str, **body) -> dict:
    """A tiny random Qwen3 (8 layers, hidden 64, the real Qwen3 tokenizer) under the model
    roots, registered as `name` (extra target fields in `body`)."""
    from workers.stages.tinymodel import build_tiny_target

    d = build_tiny_target(home / "models" / f"tiny-{name}", arch="qwen3")
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
