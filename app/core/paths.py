"""Server paths a client may name: only inside the configured roots (contracts/roots.py holds
the rule, shared with the stage runner, which checks again).

A refusal never says whether the path exists, nor where the roots are (members do not need
the server's layout); a path inside the roots may be reported missing, since it could be read."""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.core.config import get_settings
from app.core.errors import Forbidden, Invalid
from contracts.roots import within_roots

if TYPE_CHECKING:
    from app.core.auth import Principal


def resolve_inside(raw: str, roots: list[Path], *, what: str, param: str, env: str,
                   must_exist: bool = True) -> Path:
    if not raw or "\x00" in raw:
        raise Invalid(f"{param} is empty or invalid", param=param, code="invalid_path")
    if not roots:
        raise Forbidden(f"no {what} roots are configured: set {env} to the folders the server "
                        f"may read {what}s from", param=param, code="path_not_allowed")
    real = within_roots(raw, roots)
    if real is None:
        raise Forbidden(f"{param}: {raw} is outside the folders this server may read {what} "
                        f"from ({env})", param=param, code="path_not_allowed")
    try:
        missing = must_exist and not real.exists()
    except OSError as e:  # ENAMETOOLONG: the bounded path, joined to its root, is too long
        raise Invalid(f"{param}: {raw} cannot be read ({e.strerror})", param=param,
                      code="invalid_path") from None
    if missing:
        raise Invalid(f"{param}: {raw} does not exist", param=param, code="path_not_found")
    return real


def _labels() -> list[tuple[str, str]]:
    """(absolute folder, label) for every server folder a read might contain, longest first:
    the artifact store, uploads, job folders, the data and model roots, the home."""
    s = get_settings()
    named = [(s.artifacts_dir, "artifacts"), (s.uploads_dir, "uploads"), (s.jobs_dir, "jobs"),
             *((r, "data") for r in s.roots("data")), *((r, "models") for r in s.roots("model")),
             (s.home, "home")]
    out: dict[str, str] = {}
    for p, label in named:
        for form in {str(p), str(Path(p).resolve())}:
            out.setdefault(form.rstrip("/"), label)
    return sorted(out.items(), key=lambda x: -len(x[0]))


def _hide(text: str, labels: list[tuple[str, str]]) -> str:
    for folder, label in labels:
        if folder and folder in text:
            text = re.sub(re.escape(folder) + r"(/|(?![\w.-]))", f"{label}:", text)
    return text


def shown(body: Any, user: "Principal") -> Any:
    """`body` as `user` may see it: to members, every absolute server folder in its strings
    (the artifact store, uploads, the data and model roots, the home) becomes `<label>:` and
    the rest of the path stays (`artifacts:dataset/art_x`, `models:qwen3-8b`): docs/API.md, the
    roots are never shown. Admins see the paths as they are."""
    return hider(user)(body)


def hider(user: "Principal") -> Callable[[Any], Any]:
    """`shown` for many bodies of one reader (a followed log, an event stream): the folders
    are resolved once, not once per chunk."""
    if user.is_admin:
        return lambda body: body
    labels = _labels()

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return _hide(v, labels) if "/" in v else v
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v
    return walk
