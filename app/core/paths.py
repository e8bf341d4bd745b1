"""Server paths a client may name: only inside the configured roots (contracts/roots.py holds
the rule, shared with the stage runner, which checks again).

A refusal never says whether the path exists, nor where the roots are (members do not need
the server's layout); a path inside the roots may be reported missing, since it could be read."""

from __future__ import annotations

from pathlib import Path

from app.core.errors import Forbidden, Invalid
from contracts.roots import within_roots


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
    if must_exist and not real.exists():
        raise Invalid(f"{param}: {raw} does not exist", param=param, code="path_not_found")
    return real
