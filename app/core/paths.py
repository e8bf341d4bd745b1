"""Server paths a client may name: only inside the configured roots, after resolving `..` and
symlinks (a link that points out is refused like a path that is out)."""

from __future__ import annotations

from pathlib import Path

from app.core.errors import Forbidden, Invalid


def resolve_inside(raw: str, roots: list[Path], *, what: str, param: str, env: str) -> Path:
    if not raw or "\x00" in raw:
        raise Invalid(f"{param} is empty or invalid", param=param, code="invalid_path")
    if not roots:
        raise Forbidden(f"no {what} roots are configured: set {env} to the folders the server "
                        f"may read {what}s from", param=param, code="path_not_allowed")
    p = Path(raw)
    if not p.is_absolute():
        p = roots[0] / p
    real = p.resolve()
    for root in roots:
        if real == root or real.is_relative_to(root):
            if not real.exists():
                raise Invalid(f"{param}: {raw} does not exist", param=param, code="path_not_found")
            return real
    raise Forbidden(f"{param}: {raw} is outside the allowed {what} roots "
                    f"({', '.join(str(r) for r in roots)})", param=param, code="path_not_allowed")
