"""What this CPU computes fast: a half-precision forward on a CPU without native support for
it is emulated and several times slower than float32.

Measured on SmolLM2-135M (decoder forward, 1 thread): on an AVX-512 CPU with `avx512_bf16`,
bfloat16 319 tokens/s against float32 166; on an AVX2 CPU without it, bfloat16 39 tokens/s
against float32 206. So where the flags are missing, a stage computes in float32 and casts
what it stores, and says so.
"""

from __future__ import annotations

from pathlib import Path

# The instruction-set flags (/proc/cpuinfo: x86 "flags", Arm "Features") that give a CPU
# native arithmetic in each dtype.
NATIVE_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"),
                "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags, or None where they cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def cpu_compute_dtype(storage: str, flags: set[str] | None = None) -> str:
    """The dtype a CPU forward should run in to produce `storage`: the same where the CPU has
    native support (or its flags are unknown: nothing to go on), else float32."""
    native = NATIVE_FLAGS.get(storage)
    flags = cpu_flags() if flags is None else flags
    if native is None or flags is None or flags & set(native):
        return storage
    return "float32"


def float32_note(storage: str) -> str | None:
    """What a CPU stage says when it computes in float32 for `storage` here, or None."""
    import torch

    if torch.cuda.is_available() or cpu_compute_dtype(storage) == storage:
        return None
    return (f"this CPU has no native {storage} ({' or '.join(NATIVE_FLAGS[storage])} missing): "
            f"a CPU forward runs in float32 and stores {storage}, since an emulated "
            f"half-precision forward is several times slower (bfloat16 on an AVX2 CPU: 39 "
            f"tokens/s against 206 in float32 on SmolLM2-135M)")
