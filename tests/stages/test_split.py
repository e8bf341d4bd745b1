"""The `split` stage: a seeded held-out share of a dataset, before any stage
trains on it."""

from __future__ import annotations

import json

import pytest

from contracts.split import SplitParams, held_out_count
from workers.stages import split
from workers.stages.common import StageContext, StageError
from workers.stages.records import iter_records
from tests.stages.records_support import write_dataset


def _dataset(folder, n: int):
    write_dataset(folder, ({"id": f"r{i}", "source": f"d:{i + 1}",
                            "messages": [{"role": "user", "content": f"q{i}"},
                                         {"role": "assistant", "content": f"a{i}"}]}
                           for i in range(n)))
    return folder


def _split(tmp_path, src, name: str, **params) -> tuple[dict, dict[str, list[str]], list]:
    ctx = StageContext(events_path=tmp_path / f"{name}.jsonl", out_dir=tmp_path / name / "out",
                       work_dir=tmp_path / name / "work")
    out = split.run({"inputs": {"dataset": {"path": str(src), "meta": {"format": "sharegpt"}}},
                     "params": params}, ctx)
    ids = {a["name"]: [r["id"] for r in iter_records(ctx.out_dir / a["path"])]
           for a in ctx.artifacts}
    return out, ids, ctx.artifacts


def test_default_share_is_two_percent_clamped_to_32_and_500_and_half_the_records():
    p = SplitParams()
    assert [held_out_count(n, p) for n in (1, 2, 40, 64, 1000, 5000, 30_000, 10**6)] == [
        0, 1, 20, 32, 32, 100, 500, 500]


def test_split_is_seeded_disjoint_and_complete(tmp_path):
    src = _dataset(tmp_path / "ds", 2000)
    out, ids, arts = _split(tmp_path, src, "a", seed=3)
    assert out["held_out"] == 40 and out["train"] == 1960
    held, train = ids["held_out"], ids["train"]
    assert not set(held) & set(train) and len(set(held) | set(train)) == 2000
    assert sorted(held + train, key=lambda x: int(x[1:])) == [f"r{i}" for i in range(2000)]
    assert train == sorted(train, key=lambda x: int(x[1:]))  # record order kept
    meta = {a["name"]: a["meta"] for a in arts}
    assert meta["held_out"]["split"]["held_out"] == 40 and meta["train"]["num_records"] == 1960
    assert all(a["kind"] == "dataset" for a in arts)
    _, again, _ = _split(tmp_path, src, "b", seed=3)
    assert again == ids  # the same seed: the same records
    _, other, _ = _split(tmp_path, src, "c", seed=4)
    assert other["held_out"] != held


def test_a_dataset_of_one_record_cannot_be_split(tmp_path):
    src = _dataset(tmp_path / "ds", 1)
    with pytest.raises(StageError) as e:
        _split(tmp_path, src, "a")
    assert e.value.code == "too_few_records" and "in_sample" in e.value.message
    assert json.dumps(e.value.message)
