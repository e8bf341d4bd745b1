"""Which dtype a CPU forward runs in (workers/stages/cpu.py), on hand-written cpuinfo."""

from __future__ import annotations

from workers.stages.cpu import cpu_compute_dtype, cpu_flags

AVX2_ONLY = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 avx avx2 fma
"""
SAPPHIRE = """processor\t: 0
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\n"
OLD_ARM = "processor\t: 0\nFeatures\t: fp asimd\n"


def test_flags_are_read_from_cpuinfo():
    assert cpu_flags(AVX2_ONLY) == {"fpu", "sse", "sse2", "avx", "avx2", "fma"}
    assert "amx_bf16" in cpu_flags(SAPPHIRE)
    assert cpu_flags("processor\t: 0\n") is None


def test_half_precision_runs_in_float32_without_native_support():
    assert cpu_compute_dtype("bfloat16", cpu_flags(AVX2_ONLY)) == "float32"
    assert cpu_compute_dtype("float16", cpu_flags(AVX2_ONLY)) == "float32"
    assert cpu_compute_dtype("bfloat16", cpu_flags(SAPPHIRE)) == "bfloat16"
    assert cpu_compute_dtype("float16", cpu_flags(SAPPHIRE)) == "float32"  # no avx512_fp16
    assert cpu_compute_dtype("float32", cpu_flags(AVX2_ONLY)) == "float32"
    assert cpu_compute_dtype("bfloat16", cpu_flags(ARM)) == "bfloat16"
    assert cpu_compute_dtype("bfloat16", cpu_flags(OLD_ARM)) == "float32"


def test_the_plan_names_a_float32_forward_where_the_cpu_lacks_the_stored_dtype(
        tiny_target, tmp_path):
    """float16 hidden states: this CPU either has native float16 (no warning) or the plan
    says extract computes in float32, with the measured rate."""
    from tests.stages.conftest import target_input
    from tests.stages.test_plan_training import _records
    from workers.stages.cpu import float32_note
    from tests.stages.typed import run_stage
    from tests.stages.records_support import write_dataset

    write_dataset(tmp_path / "ds", _records(8))
    body = {"name": "plan-dtype", "target_id": "tgt_test", "dataset_id": "ds_test",
            "drafter": {"type": "dflash"}, "mode": "offline",
            "stages": {"prepare": {"seq_length": 256}, "extract": {"dtype": "float16"},
                       "evaluate": {}}}
    spec = {"inputs": {"dataset": {"path": str(tmp_path / "ds"), "meta": {}},
                       "target": target_input(tiny_target)},
            "params": {"run": body, "sample": 8}, "out_dir": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work")}
    plan = run_stage("plan", spec)
    note = float32_note("float16")
    said = [w for w in plan["warnings"] if w.startswith("extract: this CPU has no native")]
    assert said == ([f"extract: {note}"] if note else [])
    if note:
        assert "float16" in said[0] and "39 tokens/s against 206" in said[0]
