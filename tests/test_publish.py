"""Publishing artifacts (workers/publish.py) touches files only: all declared folders move into
place with a manifest, or, when one is missing, none does."""

from __future__ import annotations

import json

import pytest

from workers.publish import ArtifactMissing, publish_artifacts


def _out(tmp_path):
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "a" / "x.bin").write_bytes(b"12345")
    (out / "b").mkdir()
    (out / "b" / "cfg.json").write_text("{}")
    return out


def test_all_or_nothing_and_manifest(tmp_path):
    out, arts = _out(tmp_path), tmp_path / "artifacts"
    declared = [{"path": "a", "kind": "dataset", "name": "a"},
                {"path": "missing", "kind": "drafter", "name": "m"}]
    with pytest.raises(ArtifactMissing, match="'missing'"):
        publish_artifacts(declared, out, arts, job_id="job_1", inputs=[], params={})
    assert (out / "a" / "x.bin").exists() and not arts.exists()  # nothing moved
    declared = [declared[0], {"path": "b", "kind": "drafter", "name": "d",
                              "meta": {"vllm_serve_command": "vllm serve <drafter_path>"}}]
    a, b = publish_artifacts(declared, out, arts, job_id="job_1", inputs=["ds_1"],
                             params={"k": 1})
    assert not (out / "a").exists() and a.uri == str(arts / "dataset" / a.id)
    man = json.loads((arts / "dataset" / a.id / "manifest.json").read_text())
    assert man["bytes"] == 5 == a.bytes and man["inputs"] == ["ds_1"]
    assert man["producer_job"] == "job_1" and man["files"][0]["path"] == "x.bin"
    assert b.meta["vllm_serve_command"] == f"vllm serve {b.uri}" and b.meta["name"] == "d"
