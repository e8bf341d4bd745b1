"""Load a target's tokenizer as `AutoTokenizer` would, without importing torch when it can.

`from transformers import AutoTokenizer` imports torch and, through transformers' auto
classes, torch._dynamo and torch.distributed.tensor: about 8 CPU-seconds before a byte of the
tokenizer is read (measured here: 8.5 s of import, then 2.8 s to load the Qwen3 tokenizer).
The stages that only tokenize (plan, prepare) never need torch for it; the plan, which the API
runs on every run submission, paid that import every time.

Which class AutoTokenizer picks for a folder is a rule of transformers' own (the hub's
`tokenizer_class`, overridden for model types whose hub class is known wrong, remote code,
fallbacks to TokenizersBackend) that changes between releases. So this module does not
re-implement it: the first load of a folder goes through AutoTokenizer, and the class it chose
is remembered per machine, keyed by everything the choice reads (the folder's file names,
tokenizer_config.json, config.json and the transformers version), not by where the folder
is. Every later load builds that class directly with the same arguments: same class, same
files, same tokenizer, no torch.

The warm plan server (workers/stages/starter.py) also loads the tokenizer of each plan's
target before it forks the plan (`preload`): its plans inherit it and skip the load (~0.5
CPU-s for the Qwen3 tokenizer; a run submission plans once). A preloaded tokenizer is found
by its folder and the name, size and mtime of each file in it, so a folder whose files
changed is loaded again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# The files whose content AutoTokenizer's choice of class reads.
_CHOICE_FILES = ("tokenizer_config.json", "config.json")


def cache_root() -> Path:
    """Per-machine cache: $DRAFTYARD_CACHE or ~/.cache/draftyard."""
    return Path(os.environ.get("DRAFTYARD_CACHE") or Path.home() / ".cache" / "draftyard")


def _choice_key(folder: Path, transformers_version: str) -> str | None:
    # Not the folder's path: AutoTokenizer's choice reads only what is hashed here, so a copy
    # of a model elsewhere (another snapshot of the same revision, a fresh checkout) is
    # remembered too.
    h = hashlib.sha256(f"v2 {transformers_version}\n".encode())
    try:
        h.update("\0".join(sorted(os.listdir(folder))).encode())
        for name in _CHOICE_FILES:
            p = folder / name
            h.update(b"\0" + name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"-"))
    except OSError:
        return None
    return h.hexdigest()[:24]


def _remote_code(folder: Path) -> bool:
    """A tokenizer_config with an auto_map loads code from the folder: never cached."""
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "auto_map" in cfg


def _known_class(name: str) -> Any:
    """transformers' class `name`, imported on its own (no torch), or None."""
    import transformers

    cls = getattr(transformers, name, None)
    return cls if isinstance(cls, type) and cls.__module__.startswith("transformers.") else None


# What `preload` loaded, oldest first: at most PRELOAD_MAX (~85 MB each for Qwen3's).
_PRELOADED: dict[tuple, Any] = {}
PRELOAD_MAX = 2


def _stamp(folder: Path) -> tuple | None:
    """The folder and (name, size, mtime) of each file in it: what a preloaded tokenizer is
    found by; None when it cannot be read."""
    try:
        files = []
        for e in os.scandir(folder):
            if e.is_file():
                st = e.stat()
                files.append((e.name, st.st_size, st.st_mtime_ns))
        return (str(folder.resolve()), tuple(sorted(files)))
    except OSError:
        return None


def preload(path: str | Path) -> bool:
    """Load the tokenizer at `path` into this process for the processes it forks (the warm
    plan server's children); False when it is not preloaded (no folder, remote code, an
    error: the child then loads it, and reports the error, itself)."""
    folder = Path(path)
    if not folder.is_dir() or _remote_code(folder):
        return False
    stamp = _stamp(folder)
    if stamp is None:
        return False
    if stamp in _PRELOADED:
        return True
    try:
        tok = load_auto_tokenizer(folder)
    except Exception:  # noqa: BLE001  the plan that needs it reports it
        return False
    for key in [k for k in _PRELOADED if k[0] == stamp[0]]:  # the folder as it was before
        del _PRELOADED[key]
    while len(_PRELOADED) >= PRELOAD_MAX:
        del _PRELOADED[next(iter(_PRELOADED))]
    _PRELOADED[stamp] = tok
    return True


def load_auto_tokenizer(path: str | Path) -> Any:
    """The tokenizer `AutoTokenizer.from_pretrained(path, local_files_only=True)` returns."""
    folder = Path(path)
    if _PRELOADED and folder.is_dir():
        stamp = _stamp(folder)
        if stamp is not None and stamp in _PRELOADED:
            return _PRELOADED[stamp]
    import transformers

    key = _choice_key(folder, transformers.__version__) if folder.is_dir() else None
    if key is not None and _remote_code(folder):
        key = None
    memo = cache_root() / "tokenizer_classes" / f"{key}.json" if key else None
    if memo is not None and memo.is_file():
        try:
            cls = _known_class(json.loads(memo.read_text())["class"])
        except (OSError, ValueError, KeyError, TypeError):
            cls = None
        if cls is not None:
            return cls.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    name = type(tok).__name__
    if memo is not None and _known_class(name) is type(tok):
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f"{memo.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps({"class": name, "path": str(folder.resolve())}))
            tmp.replace(memo)
        except OSError:
            pass  # a cache that cannot be written only costs time
    return tok
