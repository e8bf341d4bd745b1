"""extract stage, transformers backend: hidden states equal a plain HF forward, the layout
is what speculators reads, and the planner refuses before writing anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.stages.conftest import target_input

torch = pytest.importorskip("torch")


# --- helpers shared by the extract tests ----------------------------------------------------

def fixture_texts(datasets_dir: Path) -> list[str]:
    """Every string in the fixture data sets (instructions, answers, turns), in file order."""
    out: list[str] = []

    def walk(v):
        if isinstance(v, str):
            if len(v.strip()) > 3:
                out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for f in sorted(Path(datasets_dir).glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                walk(json.loads(line))
    return out


def make_tokenized(path: Path, model_dir: Path, datasets_dir: Path, n: int,
                   cuts=(23, 61, 140, 9, 200, 37, 95, None)) -> list[list[int]]:
    """A tokenized set like the prepare stage's (input_ids, loss_mask, seq_len; torch format,
    as speculators' prepare saves it): real fixture texts through the target's real
    tokenizer and chat template, cut to varied lengths so batches need padding."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = fixture_texts(datasets_dir)
    ids_all, masks = [], []
    rendered: dict[int, tuple[list[int], int]] = {}  # rendering is the slow part: once per pair
    for i in range(n):
        pair = i % (len(texts) // 2)
        if pair not in rendered:
            user, answer = texts[2 * pair], texts[2 * pair + 1]
            msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            full = list(tok.apply_chat_template(msgs, tokenize=True)["input_ids"])
            prompt = len(tok.apply_chat_template(msgs[:1], tokenize=True,
                                                 add_generation_prompt=True)["input_ids"])
            rendered[pair] = (full, prompt)
        ids, prompt = rendered[pair]
        cut = cuts[i % len(cuts)]
        ids = ids[:cut] if cut else ids
        ids_all.append(ids)
        masks.append([0] * min(prompt, len(ids)) + [1] * max(0, len(ids) - prompt))
    ds = Dataset.from_dict({"input_ids": ids_all, "loss_mask": masks,
                            "seq_len": [len(x) for x in ids_all]})
    ds.set_format("torch")
    ds.save_to_disk(str(path))
    return ids_all


def make_spec(tmp: Path, tokenized: Path, model_dir: Path, **params) -> dict:
    return {"inputs": {"tokenized": {"path": str(tokenized), "meta": {"rows": "test"}},
                       "target": target_input(model_dir)},
            "params": {"dtype": "float32", "backend": "hf", **params},
            "out_dir": str(tmp / "out"), "work_dir": str(tmp / "work"),
            "events_path": str(tmp / "events.jsonl")}


def run_stage(spec: dict) -> tuple[dict, object]:
    from tests.stages.typed import run_stage as run_typed
    from workers.stages.common import StageContext

    ctx = StageContext.from_spec(spec)
    try:
        return run_typed("extract", spec, ctx), ctx
    finally:
        ctx.close()


def load_hs(folder: Path, idx: int) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / f"hs_{idx}.safetensors"))


def reference_states(model_dir: Path, ids: list[int], dtype=None) -> tuple[tuple, object]:
    """A plain forward of one sample alone: (HF hidden_states, the final norm module)."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    key = f"{model_dir}:{dtype}"
    m = _models.get(key)
    if m is None:
        m = _models[key] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return out.hidden_states, m.get_decoder().norm


_models: dict[str, object] = {}


def assert_close_at(got, want, dtype, atol: float, rtol: float, mean_frac: float = 1e-3) -> None:
    """float32: elementwise tolerance. bfloat16 (8 mantissa bits): batching changes the
    summation order and a rounding step can flip, so compare at the layer's own scale:
    no element off by more than 1/32 of the layer's largest value, and on average almost
    exactly equal (`mean_frac` of the scale: 1/1000 for a stored layer; a value computed from
    stored bf16 values, like the final norm's output, carries two roundings)."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
        return
    d = (got.float() - want.float()).abs()
    scale = want.float().abs().max()
    assert d.max() <= scale / 32, f"max diff {d.max():.4g} at scale {scale:.4g}"
    assert d.mean() <= scale * mean_frac, f"mean diff {d.mean():.4g} at scale {scale:.4g}"


def assert_matches_reference(folder: Path, model_dir: Path, rows: list[list[int]],
                             aux: list[int], atol: float = 2e-5, rtol: float = 1e-4,
                             dtype=None) -> None:
    dtype = dtype or torch.float32
    for idx, ids in enumerate(rows):
        f = load_hs(folder, idx)
        assert f["token_ids"].dtype == torch.int64
        assert f["token_ids"].tolist() == ids
        hs = f["hidden_states"]
        assert hs.shape == (len(ids), len(aux) + 1, 64) and hs.dtype == dtype
        ref, norm = reference_states(model_dir, ids, dtype)
        for j, layer in enumerate(aux):
            assert_close_at(hs[:, j], ref[layer][0], dtype, atol, rtol)
        # The last stored layer is the input of the final norm: normed, it is HF's last
        # (post-norm) entry, and it is not that entry itself.
        with torch.no_grad():
            # measured in CI: mean diff 1/800 of the scale after the bf16 norm
            assert_close_at(norm(hs[:, -1]), ref[-1][0], dtype, atol, rtol, mean_frac=1 / 300)
        assert not torch.allclose(hs[:, -1].float(), ref[-1][0].float(), atol=1e-1)


# --- tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok_q3(tmp_path_factory, tiny_target, datasets_dir):
    d = tmp_path_factory.mktemp("tok_q3") / "tokenized"
    return d, make_tokenized(d, tiny_target, datasets_dir, n=24)


@pytest.mark.parametrize("batch_mode", ["padded", "packed"])
def test_hf_matches_plain_forward(tmp_path, tiny_target, tok_q3, batch_mode):
    from workers.stages.extract.batching import plan_batches

    tokd, rows = tok_q3
    lens = [len(r) for r in rows]
    batches = plan_batches(list(enumerate(lens)), 512, batch_mode)
    # The batches really mix samples: padding in padded mode, several samples per row packed.
    assert len(batches) < len(rows)
    if batch_mode == "padded":
        assert sum(b.compute_tokens for b in batches) > sum(lens)
    else:
        assert max(len(b.indices) for b in batches) >= 3
    aux = [0, 3, 7]  # the embeddings, a middle and the last decoder layer's input
    summary, ctx = run_stage(make_spec(tmp_path, tokd, tiny_target, layer_ids=aux,
                                       drafter_type="eagle3", batch_tokens=512,
                                       batch_mode=batch_mode))
    assert summary["batch_mode"] == batch_mode and summary["samples"] == len(rows)
    folder = tmp_path / "out" / "hidden_states"
    assert_matches_reference(folder, tiny_target, rows, aux)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta == ctx.artifacts[0]["meta"]
    assert meta["layer_ids"] == aux and meta["num_layers_stored"] == 4
    assert meta["num_tokens"] == sum(lens) and meta["num_samples"] == len(rows)
    assert meta["theoretical_min_bytes"] == sum(lens) * (4 * 64 * 4 + 8)
    assert meta["theoretical_min_bytes"] < meta["bytes"] < 1.02 * meta["theoretical_min_bytes"]
    assert not (tmp_path / "work" / "hidden_states").exists()  # moved, not copied


def test_bfloat16_default_dtype_within_tolerance(tmp_path, tiny_target, tok_q3):
    """The default storage dtype: equal to a bf16 forward of the sample alone up to bf16
    rounding (see assert_close_at)."""
    tokd, rows = tok_q3
    spec = make_spec(tmp_path, tokd, tiny_target, max_samples=8, batch_tokens=600)
    del spec["params"]["dtype"]
    summary, ctx = run_stage(spec)
    assert ctx.artifacts[0]["meta"]["dtype"] == "bfloat16"
    assert_matches_reference(tmp_path / "out" / "hidden_states", tiny_target, rows[:8],
                             [2, 3, 4, 5, 6], dtype=torch.bfloat16)


def test_hybrid_target_padded_matches_and_packed_refused(tmp_path, tiny_target_q35,
                                                         datasets_dir):
    from workers.stages.common import StageError

    tokd = tmp_path / "tok"
    rows = make_tokenized(tokd, tiny_target_q35, datasets_dir, n=10)
    summary, _ = run_stage(make_spec(tmp_path, tokd, tiny_target_q35, batch_tokens=400))
    assert summary["batch_mode"] == "padded"
    # dflash defaults for 8 layers: 1..5 (z-lab numbering) + 1 -> layers 2..6
    assert summary["layer_ids"] == [2, 3, 4, 5, 6]
    assert_matches_reference(tmp_path / "out" / "hidden_states", tiny_target_q35, rows,
                             [2, 3, 4, 5, 6], atol=5e-5)
    # A packed row would run the gated-delta-net state across samples: refused by name.
    with pytest.raises(StageError) as e:
        run_stage(make_spec(tmp_path / "p", tokd, tiny_target_q35, batch_mode="packed"))
    assert e.value.code == "invalid_params" and "batch_mode" in e.value.message


def test_speculators_reads_the_output(tmp_path, tiny_target, tok_q3):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset, CollateFn

    tokd, rows = tok_q3
    run_stage(make_spec(tmp_path, tokd, tiny_target, drafter_type="eagle3"))
    hs_dir = tmp_path / "out" / "hidden_states"
    ds = ArrowDataset(max_len=256, datapath=str(tokd), transfer=FileTransfer(hs_dir),
                      on_missing="raise", hidden_states_dtype=torch.float32)
    assert len(ds) == len(rows)
    for i in (0, 5, len(rows) - 1):
        item = ds[i]
        n = len(rows[i])
        assert item["hidden_states"].shape == (n, 3 * 64)   # aux layers 2, 4, 5 flattened
        assert item["verifier_last_hidden_states"].shape == (n, 64)
        assert item["input_ids"].tolist() == rows[i]
        ref, norm = reference_states(tiny_target, rows[i])
        torch.testing.assert_close(item["hidden_states"][:, 64:128], ref[4][0],
                                   atol=2e-5, rtol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(norm(item["verifier_last_hidden_states"]), ref[-1][0],
                                       atol=2e-5, rtol=1e-4)
    batch = CollateFn(max_len=256, hidden_size=64, num_target_layers=3,
                      dtype=torch.float32)([ds[0], ds[1]])
    assert batch["hidden_states"].shape == (1, 256, 3 * 64)
    assert batch["verifier_last_hidden_states"].shape == (1, 256, 64)


def test_disk_refusal_is_immediate_and_writes_nothing(tmp_path, tiny_target, tok_q3):
    from workers.stages.common import StageError

    tokd, rows = tok_q3
    tokens = sum(len(r) for r in rows)
    spec = make_spec(tmp_path, tokd, tiny_target, free_bytes_override=2_000_000,
                     disk_margin_bytes=1_000_000)
    with pytest.raises(StageError) as e:
        run_stage(spec)
    err = e.value
    assert err.code == "insufficient_disk"
    need = tokens * (6 * 64 * 4 + 8) + len(rows) * 256
    assert err.details["bytes_needed"] == need and err.details["free_bytes"] == 2_000_000
    assert f"({need} bytes)" in err.message and "(2000000 bytes) free" in err.message
    for option in ("fewer samples", "online mode", "another volume"):
        assert option in err.message
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "events.jsonl"]
    assert written == []
    # Refused before the stage reported any progress (i.e. before a model was loaded).
    events = (tmp_path / "events.jsonl")
    assert not events.exists() or '"progress"' not in events.read_text()


def test_bad_layer_id_names_the_valid_range(tmp_path, tiny_target, tok_q3):
    from workers.stages.common import StageError

    tokd, _ = tok_q3
    for bad in ([2, 8], [-1, 3], [3, 3]):
        with pytest.raises(StageError) as e:
            run_stage(make_spec(tmp_path, tokd, tiny_target, layer_ids=bad))
        assert e.value.code == "invalid_params"
        if bad == [2, 8]:  # against this target's range
            assert "layers 0..7" in e.value.message
        elif bad == [-1, 3]:  # invalid for any target: refused with the params, as the API does
            assert e.value.message.startswith("params.layer_ids: ")
            assert "[-1] out of range" in e.value.message
    assert not any(p.is_file() for p in (tmp_path / "work").rglob("*"))


def test_resume_keeps_finished_redoes_broken_and_respects_max_samples(tmp_path, tiny_target,
                                                                     tok_q3):
    tokd, rows = tok_q3
    spec = make_spec(tmp_path, tokd, tiny_target, max_samples=12)
    run_stage(spec)
    out = tmp_path / "out" / "hidden_states"
    assert sorted(os.listdir(out)) == sorted([f"hs_{i}.safetensors" for i in range(12)]
                                             + ["meta.json"])
    # clone: safetensors maps the file, and this test truncates one of them below
    clean = {i: load_hs(out, i)["hidden_states"].clone() for i in range(12)}
    # Simulate a retry after a crash: the published folder back in scratch, one file
    # truncated, one temp file, one file deleted.
    work = tmp_path / "work" / "hidden_states"
    os.replace(out, work)
    (work / "hs_3.safetensors").write_bytes((work / "hs_3.safetensors").read_bytes()[:100])
    (work / ".hs_4.safetensors.tmp1.2").write_bytes(b"partial")
    (work / "hs_5.safetensors").unlink()
    kept = {i: (work / f"hs_{i}.safetensors").stat().st_mtime_ns for i in (0, 1, 2)}
    summary, _ = run_stage(spec)
    assert summary["resumed_samples"] == 10 and summary["extracted_samples"] == 2
    assert sorted(os.listdir(out)) == sorted([f"hs_{i}.safetensors" for i in range(12)]
                                             + ["meta.json"])
    for i in (0, 1, 2):
        assert (out / f"hs_{i}.safetensors").stat().st_mtime_ns == kept[i]
    for i in range(12):
        torch.testing.assert_close(load_hs(out, i)["hidden_states"], clean[i],
                                   atol=1e-5, rtol=1e-5)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "warning" and "resuming: 10 of 12" in e["data"]["message"]
               for e in events)


@pytest.mark.slow
def test_two_workers_shard_the_records(tmp_path, tiny_target, tok_q3):
    """One process per device (here two CPU workers; on a GPU box one per leased GPU):
    every sample written once, values as in a single-process run."""
    tokd, rows = tok_q3
    summary, _ = run_stage(make_spec(tmp_path, tokd, tiny_target, workers=2, batch_tokens=300))
    assert summary["samples"] == len(rows)
    folder = tmp_path / "out" / "hidden_states"
    assert sorted(os.listdir(folder)) == sorted([f"hs_{i}.safetensors" for i in range(len(rows))]
                                                + ["meta.json"])
    assert_matches_reference(folder, tiny_target, rows, [2, 3, 4, 5, 6])
