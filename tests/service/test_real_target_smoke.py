"""The real target end to end, short (`make test-real`, in CI after `make test`): SmolLM2-135M-
Instruct (Llama architecture, ChatML, a 49,152-token real vocabulary) registered with
`draftyard real-target --register`, a few dozen ShareGPT prompts regenerated with short
answers, a few DFlash training steps, and evaluate on HumanEval prompts beside the untrained
drafter and prompt lookup, all through the API of a real service and worker.

It proves the paths, not the quality (a handful of steps trains nothing): the verdict is
asserted to be honest, not good. Needs the converted model: `make real-target`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.service.test_cli import cli
from tests.tiny import ingested

pytestmark = pytest.mark.real_target

N_PROMPTS = 32          # ShareGPT prompts regenerated and trained on
MAX_PROMPT_CHARS = 300  # short prompts keep generate and extract to seconds on 2 cores
NEW_TOKENS = 16


def _link_tree(src: Path, dst: Path) -> None:
    """A copy of a cache folder by hard links (0.5 GB of weights, same volume), else bytes."""
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


@pytest.fixture(scope="module")
def real_cache(home) -> Path:
    """The machine's real-target cache, mirrored inside the service's model roots (the
    server registers only folders under DRAFTYARD_MODEL_ROOTS)."""
    from workers.stages.real_target import find_real_target, real_root

    folder = find_real_target()
    if folder is None:
        pytest.fail("the real target is not converted on this machine: run `make real-target`")
    cache = home / "models" / "cache"
    _link_tree(real_root(), cache / "real_target")
    return cache


def test_real_target_run_through_the_api(api, worker, home, real_cache):
    env_cache = os.environ.get("DRAFTYARD_CACHE")
    os.environ["DRAFTYARD_CACHE"] = str(real_cache)  # the CLI child reads it
    try:
        prompts = home / "data" / "real_prompts"
        r = cli(api, "real-target", "--register", "--prompts", str(prompts), "--json",
                timeout=900)
    finally:
        if env_cache is None:
            os.environ.pop("DRAFTYARD_CACHE")
        else:
            os.environ["DRAFTYARD_CACHE"] = env_cache
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["prompts"]["sharegpt"]["records"] > out["prompts"]["sharegpt"]["prompts"] > 0
    assert out["prompts"]["sharegpt"]["dropped"] in (0, 1)
    target = api.get(f"/v1/targets/{out['target_id']}").json()
    assert (target["architecture"], target["num_layers"], target["hidden_size"],
            target["vocab_size"]) == ("LlamaForCausalLM", 30, 576, 49152)
    humaneval = api.get(f"/v1/datasets/{out['humaneval_dataset_id']}").json()
    assert humaneval["num_records"] == out["prompts"]["humaneval"]["prompts"]

    # A few dozen short ShareGPT prompts: the written file, as ingest read it.
    # (Line by line on "\n" only: prompts hold U+2028, which str.splitlines also splits on.)
    short = []
    with (prompts / "sharegpt_prompts.jsonl").open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if len(rec["messages"][0]["content"]) <= MAX_PROMPT_CHARS:
                short.append(line.rstrip("\n"))
            if len(short) == N_PROMPTS:
                break
    small = home / "data" / "sharegpt_short.jsonl"
    small.write_text("\n".join(short) + "\n", encoding="utf-8")
    ds = ingested(api, small, "sharegpt-short", 300)
    assert ds["status"] == "ready" and ds["num_records"] == N_PROMPTS, ds

    body = {"name": "real-smoke", "target_id": target["id"], "dataset_id": ds["id"],
            "drafter": {"type": "dflash", "num_layers": 1, "block_size": 4,
                        "draft_vocab_size": 1024},
            "mode": "offline",
            "stages": {"generate": {"max_tokens": NEW_TOKENS, "temperature": 0.0,
                                    "backend": "hf", "batch_size": 16},
                       "prepare": {"seq_length": 256},
                       "extract": {"dtype": "float32", "backend": "hf"},
                       "train": {"epochs": 1, "max_steps": 3, "seq_length": 256,
                                 "drafter": {"num_anchors": 16}},
                       "evaluate": {"data": humaneval["id"], "num_prompts": 3,
                                    "max_new_tokens": NEW_TOKENS}}}
    r = api.post("/v1/runs", body)
    assert r.status_code == 201, r.text
    run = r.json()
    from tests.conftest import wait_for

    final = wait_for(lambda: (x := api.get(f"/v1/runs/{run['id']}").json())["status"]
                     in ("succeeded", "failed", "cancelled") and x, 1500, 2, "the real run")
    assert final["status"] == "succeeded", json.dumps(final, default=str)[-3000:]
    rep = api.get(f"/v1/runs/{run['id']}/report").json()
    ev = rep["evaluation"]
    # Every measure ran on the real vocabulary, and the verdict says why with prompt lookup.
    assert ev["tau"] >= 1.0 and ev["tau_baseline"] >= 1.0 and ev["tau_prompt_lookup"] >= 1.0
    assert rep["per_position"]["trained"] and rep["per_position"]["prompt_lookup"]
    assert ev["verdict"] in ("accept", "reject") and "prompt lookup" in ev["verdict_reason"]
    assert "on the evaluation data given" in ev["evaluated_on"]
    print(f"\nreal target smoke: tau {ev['tau']:.3f}, untrained {ev['tau_baseline']:.3f}, "
          f"prompt lookup {ev['tau_prompt_lookup']:.3f}; {ev['verdict']}: "
          f"{ev['verdict_reason']}")
