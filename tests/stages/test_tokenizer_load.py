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

TEXTS = ["hello world", "def f(x):\n    return x  # \u00e9\u4e2d\u6587 \U0001f600",
         "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n", "  spaces\t\ttabs\n\n"]

PROBE = r"""
import json, sys
from workers.stages.prepare.masks import load_tokenizer
from tests.stages.test_tokenizer_load import TEXTS, describe
print(json.dumps({**describe(load_tokenizer(sys.argv[1])), "torch": "torch" in sys.modules}))
"""


def describe(tok) -> dict:
    enc = [tok(t, return_offsets_mapping=True, add_special_tokens=False) for t in TEXTS]
    return {"class": type(tok).__name__, "len": len(tok), "ids": [e["input_ids"] for e in enc],
            "offsets": [[list(o) for o in e["offset_mapping"]] for e in enc],
            "eos": tok.eos_token_id, "pad": tok.pad_token_id,
            "special": sorted(map(str, tok.all_special_tokens)), "template": tok.chat_template,
            "decoded": tok.decode(enc[1]["input_ids"])}


def _load_apart(folder, cache) -> dict:
    """Load in a fresh interpreter (the way a plan or prepare process does)."""
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


def test_a_later_load_skips_torch_gives_autotokenizers_tokenizer_and_follows_changes(
        tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from workers.stages.tokenizer_load import load_auto_tokenizer

    cache = tmp_path / "cache"
    monkeypatch.setenv("DRAFTYARD_CACHE", str(cache))
    memos = lambda: sorted(p.name for p in (cache / "tokenizer_classes").glob("*.json"))  # noqa: E731
    # A Qwen3.5 config: AutoTokenizer overrides the hub's Qwen2Tokenizer for this model type
    # (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS); the remembered choice is its.
    folder = _copy(tmp_path, "q35", {"model_type": "qwen3_5"})
    auto = describe(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
    assert auto["class"] == "Qwen3_5Tokenizer"
    assert describe(load_auto_tokenizer(folder)) == auto and len(memos()) == 1
    later = _load_apart(folder, cache)  # what a plan or prepare process gets
    assert later.pop("torch") is False, "the load from the remembered class imported torch"
    assert later == auto
    # A copy elsewhere (same files, another path) is the same choice: remembered already.
    copy = shutil.copytree(folder, tmp_path / "q35-copy")
    elsewhere = _load_apart(copy, cache)
    assert elsewhere.pop("torch") is False and elsewhere == auto and len(memos()) == 1
    # The folder now says qwen3: the choice is AutoTokenizer's again, not the memo's.
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    changed = describe(load_auto_tokenizer(folder))
    assert changed["class"] == "Qwen2Tokenizer" and changed["ids"] == auto["ids"]
    assert len(memos()) == 2
    # A tokenizer_config that names code (auto_map): AutoTokenizer decides every time (here it
    # takes the local class, the code not being trusted), and nothing is remembered.
    remote = _copy(tmp_path, "r", tok_config={"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}})
    before = memos()
    assert describe(load_auto_tokenizer(remote))["class"] == "Qwen2Tokenizer"
    assert memos() == before


def test_a_preloaded_tokenizer_is_what_forked_loads_get_until_its_folder_changes(
        tmp_path, monkeypatch):
    """The warm plan server's preload (workers/stages/starter.py): a load of the same folder,
    here or in a forked child, is the preloaded tokenizer; a file that changed loads again."""
    from workers.stages import tokenizer_load as tl

    monkeypatch.setenv("DRAFTYARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tl, "_PRELOADED", {})
    folder = _copy(tmp_path, "q3")
    assert tl.load_auto_tokenizer(folder) is not tl.load_auto_tokenizer(folder)  # none kept
    assert tl.preload(folder)
    tok = tl.load_auto_tokenizer(folder)
    assert tl.load_auto_tokenizer(folder) is tok and tl.preload(folder)
    want = describe(tok)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # what a plan forked by the server does
        try:
            got = tl.load_auto_tokenizer(folder)
            os.write(w, json.dumps({"same": got is tok, **describe(got)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read())
    os.waitpid(pid, 0)
    assert child.pop("same") is True and child == want
    # The folder's files changed (an edited template, a new file): loaded again, and the
    # next preload replaces the folder's entry instead of adding one.
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 4096}))
    fresh = tl.load_auto_tokenizer(folder)
    assert fresh is not tok and fresh.model_max_length == 4096
    assert tl.preload(folder) and len(tl._PRELOADED) == 1
    assert tl.load_auto_tokenizer(folder) is not tok
    # At most PRELOAD_MAX folders; code in the folder (auto_map) is never preloaded.
    for i in range(tl.PRELOAD_MAX + 1):
        assert tl.preload(_copy(tmp_path, f"more{i}"))
    assert len(tl._PRELOADED) == tl.PRELOAD_MAX
    remote = _copy(tmp_path, "r", tok_config={"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}})
    assert not tl.preload(remote) and not tl.preload(tmp_path / "nowhere")
