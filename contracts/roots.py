"""The one rule for a path a client names: it is read only if, after resolving `..` and
symlinks, it lies inside one of the configured roots (a link that points out is refused like
a path that is out). The API applies it before it accepts a path (app/core/paths.py) and the
stage runner again before a stage opens anything (workers/stages/common.py `check_roots`):
defence in depth.

Standard library only: both sides import it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def within_roots(raw: str, roots: Iterable[str | Path]) -> Path | None:
    """The real path of `raw` when it lies inside one of `roots`, else None. A relative path
    is taken relative to the first root. Never tells whether the file exists."""
    roots = [Path(r).resolve() for r in roots]
    if not raw or "\x00" in raw or not roots:
        return None
    p = Path(raw)
    if not p.is_absolute():
        p = roots[0] / p
    try:
        real = p.resolve()
    except (OSError, RuntimeError):
        # A name past NAME_MAX (ENAMETOOLONG), a symlink loop: nothing such a path names can
        # be read, so it is refused like a path outside (the API bounds paths before this:
        # contracts/bounds.ServerPath).
        return None
    for root in roots:
        if real == root or real.is_relative_to(root):
            return real
    return None
