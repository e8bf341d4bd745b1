"""ARCHITECTURE.md's dependency direction, checked on the sources and on a real import:

- app/ (control plane) never imports torch, transformers or workers/;
- workers/stages/ (pipeline core) imports nothing from app/, SQLAlchemy, Celery or the HTTP
  framework (a stage may be an HTTP *client*, e.g. of its own vLLM server);
- contracts/ (the params both share) imports only pydantic and the standard library.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RULES = {
    "app": {"torch", "transformers", "workers", "speculators", "vllm"},
    "workers/stages": {"app", "sqlalchemy", "celery", "fastapi", "starlette", "uvicorn",
                       "redis", "kombu"},
    # The Python client ships to notebooks: httpx and the standard library only.
    "draftyard": {"app", "workers", "contracts", "torch", "transformers", "sqlalchemy", "celery",
                  "fastapi", "starlette", "pydantic", "redis", "rich", "typer"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_no_import_crosses_the_layers():
    bad = []
    for folder, banned in RULES.items():
        files = sorted((REPO / folder).rglob("*.py"))
        assert files, folder
        for f in files:
            for line, mod in _imports(f):
                if mod.split(".")[0] in banned:
                    bad.append(f"{f.relative_to(REPO)}:{line} imports {mod}")
    for f in sorted((REPO / "contracts").rglob("*.py")):
        for line, mod in _imports(f):
            top = mod.split(".")[0]
            if top not in ("pydantic", "contracts", "__future__", "typing") and \
                    top not in sys.stdlib_module_names:
                bad.append(f"{f.relative_to(REPO)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_api_process_loads_no_heavy_library():
    code = ("import sys; from app.main import create_app; create_app(); "
            "import app.cli.main, app.runs.routes, app.plans.service; "
            "print(sorted(m for m in ('torch', 'transformers', 'workers', 'pyarrow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
