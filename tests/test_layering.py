"""docs/ARCHITECTURE.md's dependency direction, checked on the sources and on a real import:

- app/ (control plane) never imports torch, transformers or workers/;
- workers/stages/ (pipeline core) imports nothing from app/, SQLAlchemy, Celery or the HTTP
  framework (a stage may be an HTTP *client*, e.g. of its own vLLM server);
- contracts/ (the params both share) imports only pydantic and the standard library;
- procgroup/ (process lifecycle, used by the CLI, the supervisor and the stages) only the
  standard library;
- app/ has no import cycle, counting function-local imports (an import moved into a function
  hides a cycle from Python, not from the reader), and a function-local import of the
  project's own modules is there only to load something late on purpose (LAZY), never to
  dodge a cycle.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RULES = {
    "app": {"torch", "transformers", "workers", "speculators", "vllm"},
    # The job domain announces; the scheduler subscribes (app/wiring.py). A job module that
    # reached into the scheduler would tie the two back together.
    "app/jobs": {"app.scheduler"},
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
                if mod.split(".")[0] in banned or ".".join(mod.split(".")[:2]) in banned:
                    bad.append(f"{f.relative_to(REPO)}:{line} imports {mod}")
    # pydantic_core: pydantic's own core (its PydanticCustomError), installed with it.
    for pkg, allowed in (("contracts", {"pydantic", "pydantic_core", "contracts"}),
                         ("procgroup", {"procgroup"})):
        for f in sorted((REPO / pkg).rglob("*.py")):
            for line, mod in _imports(f):
                top = mod.split(".")[0]
                if top not in allowed and top not in sys.stdlib_module_names:
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


# Where a function-local import of the project's own modules is deliberate, and why. Anything
# else is a cycle being dodged: import at the top, or move the shared thing down a layer.
LAZY = {
    "app/cli/": "each CLI command loads only what it runs (`draftyard --help` stays fast, "
                "the client commands never load the server)",
    "workers/__main__.py": "parse arguments and set up logging before the worker loads",
    "workers/stages/": "a stage loads its heavy backend (torch, transformers, vLLM) only "
                       "when it runs it; `python -m workers.stages` starts in milliseconds",
}
PROJECT = ("app", "workers", "contracts")


def _walk(nodes: list[ast.stmt], in_function: bool) -> Iterator[tuple[bool, ast.stmt]]:
    """Every import statement with whether it sits inside a function (TYPE_CHECKING blocks
    are not imports at run time)."""
    for n in nodes:
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            continue
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield in_function, n
        inner = in_function or isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "handlers", "finalbody"):
            for child in getattr(n, field, None) or []:
                yield from _walk([child], inner)


def _project_imports(path: Path) -> list[tuple[bool, int, str, list[str]]]:
    """(in a function, line, module, names) of each import of the project's own modules."""
    out = []
    for local, n in _walk(ast.parse(path.read_text(), str(path)).body, False):
        if isinstance(n, ast.Import):
            out += [(local, n.lineno, a.name, []) for a in n.names
                    if a.name.split(".")[0] in PROJECT]
        elif n.level == 0 and n.module and n.module.split(".")[0] in PROJECT:
            out.append((local, n.lineno, n.module, [a.name for a in n.names]))
    return out


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def function_local_imports(folder: str) -> list[str]:
    return [f"{f.relative_to(REPO)}:{line} imports {mod}"
            for f in sorted((REPO / folder).rglob("*.py"))
            for local, line, mod, _ in _project_imports(f) if local]


def test_function_local_imports_are_deliberate():
    counts = {}
    bad = []
    for folder in ("app", "workers"):
        found = function_local_imports(folder)
        counts[folder] = len(found)
        bad += [x for x in found if not any(x.startswith(k) for k in LAZY)]
    print(f"function-local intra-project imports: {counts}")
    assert not bad, "function-local imports outside LAZY (a cycle dodged?):\n" + "\n".join(bad)


def import_cycles(folder: str) -> list[list[str]]:
    """Strongly connected components of the import graph of `folder`, function-local
    imports included."""
    files = {_module(f): f for f in (REPO / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, f in files.items():
        edges = set()
        for _, _, target, names in _project_imports(f):
            for name in names or [""]:  # `from app.jobs import service` names a module
                sub = f"{target}.{name}"
                edges.add(sub if sub in files else target)
        graph[mod] = {e for e in edges if e in files and e != mod}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                cycles.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_in_app():
    cycles = import_cycles("app")
    assert not cycles, "import cycles in app/:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_processes_are_started_only_through_procgroup():
    """Nothing a job starts may outlive it: every process workers/ and app/ start
    goes through procgroup.spawn (its own group, a death signal, the attempt's tag), so no
    Popen, new session or preexec_fn of their own. subprocess.run (waited for, in-line) is
    allowed."""
    bad = []
    for top in ("workers", "app"):
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                names = [name] + [k.arg for k in node.keywords]
                hit = [n for n in names if n in ("Popen", "start_new_session", "preexec_fn",
                                                 "setsid", "fork", "spawnv")]
                if hit:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} {hit}")
    assert not bad, bad
