"""Writes the demo's bundled prompt files (committed; rerun only to change them).

Prompts are the openings of functions from Python's standard library, the kind of text the
demo target was trained on, in several dataset formats, including prompt-only records that
the generate stage must answer: 128 bare prompts, 64 Alpaca, 64 ShareGPT, and 32 held-out
bare prompts for evaluation.

    python demo/make_data.py
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from pathlib import Path

OUT = Path(__file__).parent / "data"


def snippets() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in sorted(stdlib.glob("*.py"))[::-1]:  # the other end of the list than the corpus
        lines = f.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^    def [a-z_]+\(self", line) and i + 2 < len(lines):
                body = "\n".join(lines[i:i + 3])
                if 40 < len(body) < 200 and '"""' not in body:
                    out.append(body.replace("\n    ", "\n").lstrip())
    return out


def main() -> None:
    rng = random.Random(0)
    pool = sorted(set(snippets()))
    rng.shuffle(pool)
    assert len(pool) >= 288, len(pool)
    OUT.mkdir(parents=True, exist_ok=True)
    train, held = pool[:256], pool[256:288]

    def ask(s: str) -> str:
        return f"Continue this Python code:\n{s}"

    with open(OUT / "prompts.jsonl", "w") as fh:
        for s in train[:128]:
            fh.write(json.dumps({"prompt": ask(s)}) + "\n")
    with open(OUT / "alpaca.jsonl", "w") as fh:
        for s in train[128:192]:
            fh.write(json.dumps({"instruction": "Continue this Python code.", "input": s,
                                 "output": "pass  # (written by a person; generate replaces it)"}) + "\n")
    with open(OUT / "sharegpt.jsonl", "w") as fh:
        for s in train[192:256]:
            fh.write(json.dumps({"conversations": [
                {"from": "human", "value": ask(s)},
                {"from": "gpt", "value": "return None"}]}) + "\n")
    with open(OUT / "heldout.jsonl", "w") as fh:
        for s in held:
            fh.write(json.dumps({"prompt": ask(s)}) + "\n")
    print(f"wrote {OUT}: 128 prompts, 64 alpaca, 64 sharegpt, 32 held-out")


if __name__ == "__main__":
    main()
