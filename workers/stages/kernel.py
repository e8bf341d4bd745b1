"""What every stage does the same way, in one place (docs/MAP.md, "Job types and stage specs").

- `parse_model` / `parse_params`: a spec's params or inputs, validated by their pydantic
  model (the stage entry point, workers/stages/entry.py, does it once for every stage); a
  failure is one `StageError` shape:
      code     invalid_params (params) | invalid_input (inputs)
      message  "params.<field>: <msg>; params.<field>: <msg>"  (every problem, in order)
      details  {"errors": [{"field": "params.<field>", "message": "<msg>"}, ...]}
  `field` is the whole path as the spec spells it, as the API's 422 names it (`param`).
- `input_error`: an input the stage cannot use, in the same shape;
  `target_config`: the resolved target's config (stored, else its config.json).
- `ShardSet`: the scratch folder of a stage that resumes after a kill: finished pieces
  under their final names, each written to a dot-prefixed temp name and renamed, a
  fingerprint of what they depend on beside them (pieces of another fingerprint are dropped,
  not mixed in).
- `publish`: a finished folder moved under out_dir with its manifest and declared.

Imports nothing heavy and nothing from app/, SQLAlchemy, Celery or HTTP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from contracts.resolved import ResolvedTarget

from workers.stages.common import StageContext, StageError, atomic_write, write_json_atomic

M = TypeVar("M", bound=BaseModel)


# -- params and inputs ------------------------------------------------------------------------

def validation_error(e: ValidationError, where: str, code: str) -> StageError:
    """The one StageError of a failed validation; `where`: what the model validated, as the
    spec spells it ("params", "inputs.source", "inputs.sources[2]")."""
    errors = [{"field": ".".join([where, *(str(x) for x in err["loc"])]), "message": err["msg"]}
              for err in e.errors()]
    return StageError(code, "; ".join(f"{x['field']}: {x['message']}" for x in errors),
                      {"errors": errors})


def parse_model(model: type[M], raw: Any, where: str, code: str) -> M:
    """`raw` validated by `model`; `where` names it as the spec does ("params", "inputs")."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e, where, code) from None


def parse_params(model: type[M], raw: Any) -> M:
    """`spec["params"]` validated by the stage's model (the one in contracts/ the API
    validated with too); a missing or null params is `{}` (every default)."""
    return parse_model(model, raw or {}, "params", "invalid_params")


def input_error(field: str, message: str, **details: Any) -> StageError:
    """An input the stage cannot use, in the params error's shape (`field`: "inputs.x.y")."""
    return StageError("invalid_input", f"{field}: {message}",
                      {"errors": [{"field": field, "message": message}], **details})


def target_config(target: ResolvedTarget) -> dict:
    """The resolved target's whole config: as the API stored it, else its config.json (a
    spec written by hand). `contracts.target.text_config` reads the language model's part."""
    if target.config:
        return target.config
    path = Path(target.path) / "config.json"
    if not path.is_file():
        raise input_error("inputs.target.config", f"missing, and {path} does not exist")
    return json.loads(path.read_text())


# -- resumable scratch --------------------------------------------------------------------------

class ShardSet:
    """Finished pieces of a resumable stage: files `<folder>/<prefix><id><suffix>`.

    A piece under its final name is always whole: `commit` writes it to a dot-prefixed temp
    name and renames it, so a kill at any moment leaves whole pieces and temp files, and
    `open` drops the temp files. The folder holds nothing else, so every dot-prefixed file
    in it is a killed attempt's temp: ours, or a writer library's own (safetensors 0.8 writes
    through a `.tmpXXXXXX` file beside its target and renames it). The fingerprint (a JSON
    object of what the pieces depend on: inputs, params, stage version) is kept at
    `state_path`; `open` under another one drops every piece, since a piece of one
    configuration must not be mixed into another.
    """

    def __init__(self, folder: Path | str, state_path: Path | str, prefix: str, suffix: str):
        self.folder = Path(folder)
        self.state_path = Path(state_path)
        self.prefix, self.suffix = prefix, suffix
        self._final = re.compile(rf"^{re.escape(prefix)}(\d+){re.escape(suffix)}$")

    def path(self, sid: int, width: int = 0) -> Path:
        return self.folder / f"{self.prefix}{sid:0{width}d}{self.suffix}"

    def previous(self) -> Any:
        """The fingerprint the pieces were made under (None: no earlier attempt)."""
        return json.loads(self.state_path.read_text()) if self.state_path.is_file() else None

    def stale(self, fingerprint: Any) -> bool:
        """Read-only: do the pieces here come from another configuration?"""
        prev = self.previous()
        return prev is not None and prev != fingerprint

    def open(self, fingerprint: Any) -> bool:
        """Ready the folder for this fingerprint: drop the temp files of a killed attempt,
        and every piece when they were made under another fingerprint (returns False)."""
        kept = not self.stale(fingerprint)
        if not kept:
            for p in self.done().values():
                p.unlink()
        write_json_atomic(self.state_path, fingerprint)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.clean_temp()
        return kept

    def clean_temp(self) -> int:
        """Delete the temp files a killed attempt left (every dot-prefixed file); returns
        how many."""
        n = 0
        if self.folder.is_dir():
            for e in os.scandir(self.folder):
                if e.name.startswith(".") and e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
                    n += 1
        return n

    def recover(self, published: Path) -> bool:
        """Take back a folder an earlier attempt published (moved under out_dir) but died
        before declaring, so its pieces count as done; True when there was one."""
        if self.folder.exists() or not Path(published).is_dir():
            return False
        os.replace(published, self.folder)
        return True

    def done(self) -> dict[int, Path]:
        """{id: path} of the finished pieces, by id."""
        out: dict[int, Path] = {}
        if self.folder.is_dir():
            for e in os.scandir(self.folder):
                m = self._final.match(e.name)
                if m:
                    out[int(m.group(1))] = Path(e.path)
        return dict(sorted(out.items()))

    def commit(self, sid: int, write: Callable[[Path], Any], width: int = 0,
               fsync: bool = False) -> Path:
        """Write piece `sid` whole or not at all: `write(tmp)` fills a temp file, renamed to
        the final name. `fsync` first when a lost piece costs more than a disk flush."""
        return atomic_write(self.path(sid, width), write, fsync)


# -- publishing ---------------------------------------------------------------------------------

def publish(ctx: StageContext, folder: Path | str, name: str, kind: str, meta: dict,
            meta_file: str = "meta.json") -> Path:
    """Write the manifest into a finished folder, move it to `out_dir/<name>` (a rename; a
    copy when the scratch is on another filesystem) unless it is there already, and declare
    it as the artifact. The supervisor moves out_dir into place only when the stage succeeds."""
    folder, final = Path(folder), ctx.out_dir / name
    write_json_atomic(folder / meta_file, meta)
    if folder.resolve() != final.resolve():
        if final.exists():  # left by an attempt that died before declaring it
            shutil.rmtree(final)
        try:
            os.replace(folder, final)
        except OSError:  # another filesystem
            shutil.move(str(folder), str(final))
    ctx.artifact(name, kind, final, meta)
    return final
