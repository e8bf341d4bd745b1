"""The tokenize-only stages (plan, prepare) load the tokenizer AutoTokenizer would, and after
the first time without importing torch (workers/stages/tokenizer_load.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import REPO
from workers.stages.tinymodel import qwen3_tokenizer_dir

PROBE = r"""
import json, sys
from workers.stages.prepare.masks import load_tokenizer
tok = load_tokenizer(sys.argv[1])
texts = ["hello world", "def f(x):\n    return x  # \u00e9\u4e2d\u6587 \U0001f600",
         "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n", "  spaces\t\ttabs\n\n"]
enc = [tok(t, return_offsets_mapping=True, add_special_tokens=False) for t in texts]
print(json.dumps({"class": type(tok).__name__, "torch": "torch" in sys.modules, "len": len(tok),
                  "ids": [e["input_ids"] for e in enc],
                  "offsets": [[list(o) for o in e["offset_mapping"]] for e in enc],
                  "eos": tok.eos_token_id, "pad": tok.pad_token_id,
                  "special": sorted(map(str, tok.all_special_tokens)),
                  "template": tok.chat_template,
                  "decoded": tok.decode(enc[1]["input_ids"])}))
"""


def _load(folder, cache) -> dict:
    env = {**os.environ, "DRAFTYARD_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _copy(tmp_path, name: str, config: dict | None = None, tok_config: dict | None = None):
    d = tmp_path / name
    shutil.copytree(qwen3_tokenizer_dir(), d)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if tok_config is not None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, **tok_config}))
    return d


def test_second_load_skips_torch_gives_the_same_tokenizer_and_follows_changes(tmp_path):
    cache = tmp_path / "cache"
    # A Qwen3.5 config: AutoTokenizer overrides the hub's Qwen2Tokenizer for this model type
    # (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS); the remembered choice is its.
    folder = _copy(tmp_path, "q35", {"model_type": "qwen3_5"})
    first, again = _load(folder, cache), _load(folder, cache)
    assert first["torch"] is True and first["class"] == "Qwen3_5Tokenizer"  # AutoTokenizer's
    assert again["torch"] is False, "the second load imported torch"
    assert again == {**first, "torch": False}
    # The folder now says qwen3: the choice is AutoTokenizer's again, not the memo's.
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    changed = _load(folder, cache)
    assert changed["torch"] is True and changed["class"] == "Qwen2Tokenizer"
    assert changed["ids"] == first["ids"]
    # A tokenizer_config that names code (auto_map): whatever AutoTokenizer decides for it
    # (here: the local class, as the code is not trusted), it decides every time.
    remote = _copy(tmp_path, "r", tok_config={"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}})
    memos = sorted((cache / "tokenizer_classes").iterdir())
    assert _load(remote, cache)["torch"] is True
    assert sorted((cache / "tokenizer_classes").iterdir()) == memos
