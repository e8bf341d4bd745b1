"""Fixtures of the vllm_cpu tests.

vLLM's CPU attention supports head sizes 32, 64, 80, ... only; the tests' tiny targets (and
the demo target) have hidden 64 over 4 heads, head_dim 16, which vllm-cpu 0.32 accepts at
start, reports healthy, and then dies on with "Unsupported CPU attention configuration:
head_dim=16" at the first request (test_generate.py checks the stage reports exactly that).
So the target here has 2 query heads and 1 KV head of dim 32, and is trained briefly on the
repetitive chat set the train stage tests use, so that its greedy answers and a drafter
trained on them mean something (docs/FIELD-NOTES.md: a random target repeats one token).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stages import train_support as ts


@pytest.fixture(autouse=True)
def _vllm_of_the_venv(monkeypatch):
    """Which vLLM the stages run is the server's setting: this venv's."""
    from tests.stages.vllm_cpu.support import vllm_setting

    for k, v in vllm_setting().items():
        monkeypatch.setenv(k, v)


@pytest.fixture(scope="session")
def vllm_train_data(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(target, tokenized set, HF hidden states at layers 1, 4, 7 + last)."""
    from tests.stages.vllm_cpu.support import vllm_venv
    from workers.stages.tinymodel import build_tiny_target

    vllm_venv()  # skip before building anything when there is no vLLM here
    base = tmp_path_factory.mktemp("vllm_cpu")
    raw = build_tiny_target(base / "raw", arch="qwen3", heads=2, kv_heads=1)
    tok = ts.build_tokenized(raw, base / "tokenized")
    target = ts.train_target(raw, tok, base / "target")
    hs = ts.build_hidden_states(target, tok, base / "hidden_states")
    return target, tok, hs


@pytest.fixture(scope="session")
def vllm_mtp_data(tmp_path_factory, templates_dir) -> tuple[Path, Path, Path]:
    """(target, tokenized set, hidden states) for `mtp`: the tiny Qwen3.5 hybrid
    (gated-delta-net + full attention, the Qwen3.6 chat template) with full-attention heads of
    dim 32 as above and gated-delta-net heads of 128 as Qwen3.5's (vllm-cpu's kernel for those
    takes 128: at 16 "chunk_gated_delta_rule_cpu: expect head_dim to be multiples of 32", at
    32 "Unexpected head dim size, 32"), briefly trained, then given one native MTP layer
    (workers/stages/tinymodel.py `add_mtp_layers`); the hidden states hold layer N-1 and the
    input of the final norm, which MTP reads (as tests/stages/test_methods.py)."""
    import json

    from tests.stages.vllm_cpu.support import vllm_venv
    from workers.stages.tinymodel import add_mtp_layers, build_tiny_target

    vllm_venv()
    base = tmp_path_factory.mktemp("vllm_cpu_mtp")
    raw = build_tiny_target(base / "raw", arch="qwen3_5", heads=2, kv_heads=1, linear_head_dim=128,
                            chat_template=(templates_dir / "qwen3_6.jinja").read_text())
    tok = ts.build_tokenized(raw, base / "tokenized")
    target = add_mtp_layers(ts.train_target(raw, tok, base / "target"))
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    return target, tok, ts.build_hidden_states(target, tok, base / "hs", layer_ids=[n - 1])
