"""extract stage, pure parts: layer defaults and validation, the storage planner, batching,
params, and the writer's resume scan."""

from __future__ import annotations

from functools import partial

import pytest

from contracts.extract import ExtractParams
from workers.stages.common import StageError
from workers.stages.extract.batching import plan_batches, shard_batches
from workers.stages.extract.layers import default_layer_ids, is_hybrid, resolve_layers
from workers.stages.extract.planner import (
    check_disk,
    disk_check,
    estimate_hidden_state_bytes,
)
from workers.stages.kernel import parse_params as _parse

QWEN3_8B = {"num_hidden_layers": 36, "hidden_size": 4096}
parse_params = partial(_parse, ExtractParams)


def test_layer_defaults_match_speculators_conventions():
    # DFlash: z-lab's five layers from 1 to N-3, shifted by one (their id is a layer's
    # output, ours the input of the next); speculators' converter docs give the same
    # numbers for Qwen3-8B.
    assert default_layer_ids("dflash", 36) == [2, 10, 18, 26, 34]
    # EAGLE-3: speculators' default low/middle/high.
    assert default_layer_ids("eagle3", 36) == [2, 18, 33]
    assert default_layer_ids("dflash", 8) == [2, 3, 4, 5, 6]
    assert default_layer_ids("eagle3", 8) == [2, 4, 5]
    for n in range(1, 12):  # tiny targets: distinct, in range, never the last layer
        for kind in ("dflash", "eagle3"):
            ids = default_layer_ids(kind, n)
            assert ids and len(set(ids)) == len(ids)
            assert all(0 <= i <= max(n - 1, 0) for i in ids)


def test_layer_plan_stores_aux_then_last_and_validates():
    plan = resolve_layers({"text_config": QWEN3_8B, "model_type": "vlm"}, "eagle3", None)
    assert plan.stored == (2, 18, 33, 36) and plan.num_stored == 4 and plan.hidden_size == 4096
    with pytest.raises(StageError) as e:
        resolve_layers(QWEN3_8B, "dflash", [1, 36])
    assert e.value.code == "invalid_params"
    assert "layers 0..35" in e.value.message and "always stored last" in e.value.message
    assert e.value.details["valid_range"] == [0, 35]
    with pytest.raises(StageError, match="distinct"):
        resolve_layers(QWEN3_8B, "dflash", [4, 4])
    with pytest.raises(StageError, match="at least one"):
        resolve_layers(QWEN3_8B, "dflash", [])


def test_hybrid_detection():
    assert not is_hybrid({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2})
    assert is_hybrid({"text_config": {"num_hidden_layers": 4, "layer_types":
                                      ["linear_attention"] * 3 + ["full_attention"]}})


def test_planner_bytes_and_message():
    # Qwen3-8B, 5 stored layers, bf16: 40 KiB per token plus the int64 token id.
    assert estimate_hidden_state_bytes(1, 5, 4096, "bfloat16") == 40 * 1024 + 8
    assert estimate_hidden_state_bytes(1000, 4, 64, "float32", num_samples=3) == \
        1000 * (4 * 64 * 4 + 8) + 3 * 256
    ok = disk_check(10, "/nonexistent/deeper", margin=5, free_bytes_override=15)
    assert ok.ok and ok.free_bytes == 15
    with pytest.raises(StageError) as e:
        check_disk(2 * 1024**4, "/data/x", margin=1 << 30, free_bytes_override=500 * 1024**3)
    err = e.value
    assert err.code == "insufficient_disk"
    assert "2.0 TiB" in err.message and "500.0 GiB" in err.message and "/data/x" in err.message
    assert "margin 1.0 GiB" in err.message
    for option in ("fewer samples", "online mode", "another volume", "DRAFTYARD_HOME"):
        assert option in err.message
    assert err.details["bytes_needed"] == 2 * 1024**4
    # the real filesystem is asked when there is no override
    assert disk_check(1, ".", margin=0).free_bytes > 0


def test_hidden_state_bytes_for_the_plan():
    lp = resolve_layers(QWEN3_8B, "dflash", None)
    assert lp.num_stored == 6 and lp.hidden_size == 4096
    least = estimate_hidden_state_bytes(150, lp.num_stored, lp.hidden_size, "bfloat16")
    assert least == 150 * (6 * 4096 * 2 + 8)
    assert estimate_hidden_state_bytes(150, 6, 4096, "bfloat16", 2) == least + 2 * 256
    with pytest.raises(StageError, match=r"layers 0\.\.35"):
        resolve_layers(QWEN3_8B, "dflash", [40])


def test_batches_respect_budget_and_cover_every_sample_once():
    lens = [5, 300, 17, 17, 64, 1, 129, 4000, 33, 250, 250, 2, 0]
    items = list(enumerate(lens))
    for mode in ("padded", "packed"):
        batches = plan_batches(items, 512, mode)
        got = sorted(i for b in batches for i in b.indices)
        assert got == [i for i, n in items if n > 0]   # empty rows are the caller's
        for b in batches:
            assert b.lengths == tuple(lens[i] for i in b.indices)
            assert b.compute_tokens <= 512 or len(b.indices) == 1   # 4000 stands alone
        if mode == "padded":
            assert all(b.compute_tokens == len(b.lengths) * max(b.lengths) for b in batches)
        else:
            assert all(b.compute_tokens == b.tokens for b in batches)
    # Longest first, so a batch too big for memory fails at the start.
    assert plan_batches(items, 512, "padded")[0].lengths == (4000,)
    padded = plan_batches(items, 512, "padded")
    waste = sum(b.compute_tokens for b in padded) / sum(lens)
    assert waste < 1.25


def test_shards_balance_and_partition():
    batches = plan_batches([(i, 10 + (i * 37) % 200) for i in range(300)], 1024, "padded")
    shards = shard_batches(batches, 3)
    assert sorted(i for s in shards for b in s for i in b.indices) == list(range(300))
    loads = [sum(b.compute_tokens for b in s) for s in shards]
    assert max(loads) - min(loads) <= max(b.compute_tokens for b in batches)


def test_params_refuse_unknown_and_bad_fields():
    p = parse_params({})
    assert (p.drafter_type, p.dtype, p.backend, p.batch_tokens) == \
        ("dflash", "bfloat16", "auto", 8192)
    assert p.disk_margin_bytes == 1 << 30
    for raw, field in [({"batch_token": 5}, "batch_token"), ({"dtype": "fp8"}, "dtype"),
                       ({"vllm": {"concurrency": 0}}, "vllm.concurrency"),
                       ({"vllm": {"tp": 2}}, "vllm.tp")]:
        with pytest.raises(StageError) as e:
            parse_params(raw)
        assert e.value.code == "invalid_params" and f"params.{field}" in e.value.message


def test_writer_scan_keeps_good_files_only(tmp_path):
    torch = pytest.importorskip("torch")
    from workers.stages.extract.writer import (
        samples,
        scan_finished,
        write_sample,
    )

    for i, n in enumerate([3, 5, 4]):
        write_sample(tmp_path, i, torch.zeros(n, 2, 8, dtype=torch.bfloat16),
                     torch.arange(n, dtype=torch.int32))
    (tmp_path / ".hs_7.safetensors.tmp9.1").write_bytes(b"x")
    assert samples(tmp_path).clean_temp() == 1
    (tmp_path / "hs_2.safetensors").write_bytes(b"\x00" * 16)           # truncated
    good, bad = scan_finished(tmp_path, {0: 3, 1: 6}, 2, 8, "bfloat16", delete_bad=False)
    assert good == {0}
    assert "shape" in bad[1] and "not selected" in bad[2]
    assert (tmp_path / "hs_2.safetensors").exists()                     # read-only scan
    good, bad = scan_finished(tmp_path, {0: 3, 1: 5}, 2, 8, "float32")
    assert good == set() and "dtype" in bad[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
