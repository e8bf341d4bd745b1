"""The docs the README and the code cite are in the repo (`docs/`): a clone has nothing beside
it, so a citation of `../shared/design/...`, or of a design doc by a bare name that a reader
cannot open from the checkout, is a dead end."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("app", "workers", "contracts", "draftyard", "procgroup", "tests", "bench", "README.md",
         "docs", "Makefile")
# A path into the repo's docs folder, as code and the README write it.
CITED = re.compile(r"(?<![\w./-])docs/[\w./-]*\w")
# The design docs by name, without the folder that holds them.
BARE = re.compile(r"(?<![\w/-])(ARCHITECTURE\.md|API\.md|STYLE\.md|FIELD-NOTES)")
# A markdown link to a neighbouring page (not a URL, not an anchor).
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)#\s]+)")
SELF = "tests/test_docs.py"


def _files() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files", "--", *SCOPE], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    out = {}
    for n in names:
        p = ROOT / n
        if p.suffix in (".py", ".md", ".js", ".html", ".css", "") and p.is_file():
            out[n] = p.read_text(encoding="utf-8", errors="replace")
    return out


def test_every_cited_doc_exists_and_nothing_cites_outside_the_repo():
    files = _files()
    assert "README.md" in files and len(files) > 50
    missing, outside, bare = [], [], []
    for name, text in files.items():
        if name == SELF:
            continue
        in_docs = name.startswith("docs/")
        for i, line in enumerate(text.splitlines(), 1):
            # Inside docs/ a page links its neighbours by relative path; elsewhere by docs/...
            cited = ([str(Path("docs") / m.group(1)) for m in LINK.finditer(line)] if in_docs
                     else [m.group(0).rstrip(".") for m in CITED.finditer(line)])
            missing += [f"{name}:{i}: {path}" for path in cited if not (ROOT / path).exists()]
            # ../shared/fixtures is data the tests read (tests/stages/conftest.py), not a doc.
            if "../shared/" in line and "../shared/fixtures" not in line:
                outside.append(f"{name}:{i}: {line.strip()}")
            if not in_docs:
                bare += [f"{name}:{i}: {m.group(1)}" for m in BARE.finditer(line)]
    assert not missing, "cited but not in the repo:\n" + "\n".join(missing)
    assert not outside, "cites a folder beside the checkout:\n" + "\n".join(outside)
    assert not bare, "cite design docs by their path (docs/...):\n" + "\n".join(bare)


def test_the_readme_sends_readers_to_the_repos_own_design_docs():
    readme = (ROOT / "README.md").read_text()
    for doc in ("docs/ARCHITECTURE.md", "docs/API.md", "docs/FIELD-NOTES.md"):
        assert doc in readme and (ROOT / doc).is_file(), doc


# "issue 27", "Issue 22.", "issue #14": a number the next reader cannot open (docs/STYLE.md rule 21).
ISSUE = re.compile(r"\bissues? #?\d+", re.I)
PRODUCT = ("app/", "workers/", "contracts/", "draftyard/", "procgroup/", "Makefile")
# The tests, the benches and the docs are read by the next engineer too.
READ_TOO = ("tests/", "bench/", "docs/", "README.md")


def _issue_citations(prefixes: tuple[str, ...]) -> list[str]:
    return [f"{name}:{n}: {line.strip()}" for name, text in _files().items()
            if name.startswith(prefixes) and name != SELF
            for n, line in enumerate(text.splitlines(), 1) if ISSUE.search(line)]


def test_product_code_cites_no_issue_numbers():
    found = _issue_citations(PRODUCT)
    assert not found, "say the reason, or point at docs/ or a test:\n" + "\n".join(found)


def test_tests_benches_and_docs_cite_no_issue_numbers():
    found = _issue_citations(READ_TOO)
    assert not found, "say the reason, or point at docs/ or a test:\n" + "\n".join(found)
    assert {n.split("/")[0] for n in _files() if n.startswith(READ_TOO)} >= {
        "tests", "bench", "docs"}  # the scope is read, or the test above checks nothing
