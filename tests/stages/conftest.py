"""Fixtures for the pipeline-core tests: real fixtures from ../shared, tiny real models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_fixtures() -> Path:
    """`../shared/fixtures` beside the checkout (CI clones main with shared/ beside it)."""
    for cand in (os.environ.get("DRAFTYARD_SHARED_FIXTURES"), REPO.parent / "shared" / "fixtures",
                 REPO / "shared" / "fixtures"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    pytest.skip("shared fixtures not found beside the checkout")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return shared_fixtures()


@pytest.fixture(scope="session")
def templates_dir(fixtures_dir) -> Path:
    return fixtures_dir / "chat_templates"


@pytest.fixture(scope="session")
def datasets_dir(fixtures_dir) -> Path:
    return fixtures_dir / "datasets"


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """A random tiny Qwen3 target with the real Qwen3 tokenizer and chat template."""
    from workers.stages.tinymodel import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("tiny_qwen3"), arch="qwen3")


@pytest.fixture(scope="session")
def tiny_target_q35(tmp_path_factory, templates_dir) -> Path:
    """A random tiny Qwen3.5-hybrid target carrying the Qwen3.6 chat template."""
    from workers.stages.tinymodel import build_tiny_target

    tmpl = (templates_dir / "qwen3_6.jinja").read_text()
    return build_tiny_target(tmp_path_factory.mktemp("tiny_qwen35"), arch="qwen3_5",
                             chat_template=tmpl)


def target_input(model_dir: Path, **overrides) -> dict:
    """The resolved `target` input a stage receives for a model directory."""
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    t = {"path": str(model_dir), "tokenizer_path": str(model_dir), "chat_template": None,
         "chat_template_kwargs": {}, "config": cfg}
    t.update(overrides)
    return t


@pytest.fixture(scope="session")
def train_data(tiny_target, tmp_path_factory):
    """(target, tokenized set, hidden states) for the train stage tests: a small repetitive
    chat set, the tiny target briefly trained on it, and its hidden states at layers 1, 4, 7
    (see tests/stages/train_support.py)."""
    from tests.stages import train_support as ts

    base = tmp_path_factory.mktemp("train_data")
    tok = ts.build_tokenized(tiny_target, base / "tokenized")
    target = ts.train_target(tiny_target, tok, base / "target")
    hs = ts.build_hidden_states(target, tok, base / "hidden_states")
    return target, tok, hs


@pytest.fixture(scope="session")
def demo_target() -> Path:
    """The demo target: the tiny Qwen3 briefly trained on stdlib code (varied greedy output).

    Built once per machine and cached (the build is deterministic; see
    workers/stages/demo_target.py), so only the first session pays for the training.
    """
    from workers.stages.demo_target import cached_demo_target

    return cached_demo_target()


@pytest.fixture(scope="session")
def qwen_tok():
    """The real Qwen3 tokenizer (loaded once: the mask tests share it)."""
    from workers.stages.prepare.masks import load_tokenizer
    from workers.stages.tinymodel import qwen3_tokenizer_dir

    return load_tokenizer(qwen3_tokenizer_dir())
