"""The six seed sources of bench/scale.py, synthetic, each in its dataset's native shape.

Deterministic from a seed. Text is random words (bench/ingest.py's TextPool: slices of one long
pre-generated string), with lengths drawn from a log-normal per field whose median follows the
real set. Medians in characters, approximate, read off the datasets' cards and viewer length
histograms on the Hugging Face Hub (not exact statistics; sigma chosen so the long tails reach
the lengths seen there), clipped at 24,000 characters:

  source            file shape (HF repo)                                   field medians (chars)
  OpenOrca          parquet: id, system_prompt, question, response         system 0-300 (1 of 16
                    (Open-Orca/OpenOrca, 4.2M rows)                        fixed prompts, 1/4 empty),
                                                                           question 480, response 330
  Evol-CodeAlpaca   jsonl: instruction, output                             instruction 420,
                    (theblackcat102/evol-codealpaca-v1, 111K)              output 1,700
  Magicoder         jsonl: lang, seed, problem, solution                   problem 760, solution 1,100
                    (ise-uiuc/Magicoder-OSS-Instruct-75K)
  OpenAssistant     jsonl, the flat message export: message_id, parent_id,  prompter 110, assistant 650;
                    message_tree_id, role prompter|assistant, text, rank,  2-3 ranked replies per
                    lang, deleted (OpenAssistant/oasst1, 88K messages)      prompt, depth 2-4
  CodeAlpaca        jsonl: instruction, input, output                      instruction 75, input 55
                    (sahil2801/CodeAlpaca-20k)                             (40% non-empty), output 190
  LIMA              jsonl: conversations (list of strings), source         prompt 330, answer 2,400
                    (GAIR/lima, 1,030 rows: the curator takes all of it)

Cross-source duplicates: about 3% of the prompts of every source after the first prompt-only
one are copies of an earlier source's prompt with whitespace changed (doubled spaces, a newline
for a space, trailing blanks), which mix's dedupe must catch. Broken lines: a few per source
(`broken_per_source`): truncated JSON, a wrong-typed field, an empty prompt (OpenOrca, being
parquet, gets null/empty fields instead of bad JSON; OpenAssistant gets an orphan message).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.ingest import TextPool

MAX_CHARS = 24_000
SYSTEM_PROMPTS = [""] * 5 + [
    "You are an AI assistant. You will be given a task. You must generate a detailed and long "
    "answer.",
    "You are a helpful assistant, who always provide explanation. Think like you are answering "
    "to a five year old.",
    "You are an AI assistant that helps people find information. User will you give you a "
    "question. Your task is to answer as faithfully as you can. While answering think "
    "step-by-step and justify your answer.",
    "You are an AI assistant. User will you give you a task. Your goal is to complete the task "
    "as faithfully as you can. While performing the task think step-by-step and justify your "
    "steps.",
    "Explain how you used the definition to come up with the answer.",
    "You are a teacher. Given a task, you explain in simple steps what the task is asking, any "
    "guidelines it provides and how to use those guidelines to find the answer.",
    "You should describe the task and explain your answer. While answering a multiple choice "
    "question, first output the correct answer(s). Then explain why other answers are wrong.",
    "Given a definition of a task and a sample input, break the definition into small parts.",
    "You are an AI assistant that follows instruction extremely well. Help as much as you can.",
    "User will you give you a task with some instruction. Your job is follow the instructions "
    "as faithfully as you can.",
    "You are a helpful assistant, who always provide explanation.",
]


@dataclass
class Source:
    name: str
    file: str
    weight: float     # the curator's mix weight
    rows: int         # records (OpenAssistant: trees) in the file


def plan_sources(n: int) -> list[Source]:
    """Source files for a mix of about n records: OpenOrca the most (a file twice its share,
    weight 0.5), the code sets at weight 1, LIMA all of it (1,030 rows, fewer at tiny n)."""
    lima = min(1030, max(8, n // 12))
    return [Source("openorca", "openorca.parquet", 0.5, round(0.84 * n)),
            Source("evol_codealpaca", "evol_codealpaca.jsonl", 1.0, round(0.16 * n)),
            Source("magicoder", "magicoder.jsonl", 1.0, round(0.14 * n)),
            Source("oasst", "oasst_messages.jsonl", 1.0, round(0.05 * n)),
            Source("codealpaca", "codealpaca.jsonl", 1.0, round(0.15 * n)),
            Source("lima", "lima.jsonl", 1.0, lima)]


class Gen:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.pool = TextPool(self.rng, size=1 << 22)
        self.prompts: list[str] = []  # earlier prompt-only sources' prompts, for duplicates

    def text(self, median: float, sigma: float = 0.8, lo: int = 4) -> str:
        n = int(min(MAX_CHARS, max(lo, self.rng.lognormvariate(math.log(median), sigma))))
        return self.pool(n)

    def prompt(self, median: float, sigma: float = 0.8) -> str:
        """A fresh prompt, or (3%) an earlier source's with its whitespace changed."""
        rng = self.rng
        if self.prompts and rng.random() < 0.03:
            p = rng.choice(self.prompts)
            words = p.split(" ")
            i = rng.randrange(len(words))
            words[i] = words[i] + rng.choice([" ", "\n", "\t"])
            return " ".join(words) + rng.choice(["", " ", "\n"])
        p = self.text(median, sigma)
        if rng.random() < 0.02 and len(self.prompts) < 200_000:
            self.prompts.append(p)
        return p


def _broken(rng: random.Random, good: bytes, k: int) -> bytes:
    kind = k % 3
    if kind == 0:
        return good[: max(2, len(good) // 2)].rstrip(b"\n") + b"\n"   # truncated JSON
    if kind == 1:
        return b'{"instruction": 42, "output": ["not", "text"], "conversations": 7}\n'
    return b"[1, 2, 3]\n"


def _write_jsonl(path: Path, rows, rng: random.Random, broken: int, total: int) -> int:
    every = max(1, total // max(1, broken))
    n = bad = 0
    with open(path, "wb", buffering=1 << 22) as f:
        for i, row in enumerate(rows):
            line = orjson.dumps(row) + b"\n"
            if bad < broken and i % every == every // 2:
                f.write(_broken(rng, line, bad))
                bad += 1
            f.write(line)
            n += 1
    return n


def _openorca(g: Gen, path: Path, rows: int, broken: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, every = g.rng, max(1, rows // max(1, broken))
    writer = None
    batch: dict[str, list] = {"id": [], "system_prompt": [], "question": [], "response": []}
    for i in range(rows):
        sysp = rng.choice(SYSTEM_PROMPTS)
        q = g.prompt(480, 0.9) if not sysp else g.text(480, 0.9)
        resp: str | None = g.text(330, 1.0)
        if i % every == every // 2 and i // every < broken:
            q, resp = (None, resp) if i % 2 else (q, None)  # null fields: rejected rows
        for k, v in (("id", f"{rng.choice(['niv', 'flan', 't0', 'cot'])}.{i}"),
                     ("system_prompt", sysp), ("question", q), ("response", resp)):
            batch[k].append(v)
        if len(batch["id"]) >= 20_000 or i == rows - 1:
            table = pa.table(batch, schema=pa.schema([(k, pa.string()) for k in batch]))
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="snappy")
            writer.write_table(table)
            batch = {k: [] for k in batch}
    if writer is not None:
        writer.close()


def _oasst_rows(g: Gen, trees: int, broken: int):
    rng, every = g.rng, max(1, trees // max(1, broken))
    for t in range(trees):
        tree = f"tree-{t:07d}"
        root = f"{tree}-0"
        yield {"message_id": root, "parent_id": None, "message_tree_id": tree,
               "role": "prompter", "text": g.prompt(110, 1.0), "lang": "en", "deleted": False,
               "rank": None}
        frontier, k = [(root, "prompter", 0)], 1
        depth_max = rng.choice([1, 1, 2, 3])
        while frontier:
            parent, role, depth = frontier.pop()
            if depth >= depth_max:
                continue
            if role == "prompter":
                n_rep = rng.choice([1, 2, 3, 3])
                for r in range(n_rep):
                    mid = f"{tree}-{k}"
                    k += 1
                    yield {"message_id": mid, "parent_id": parent, "message_tree_id": tree,
                           "role": "assistant", "text": g.text(650, 0.9), "lang": "en",
                           "deleted": False, "rank": r}
                    if r == 0:
                        frontier.append((mid, "assistant", depth + 1))
            else:
                mid = f"{tree}-{k}"
                k += 1
                yield {"message_id": mid, "parent_id": parent, "message_tree_id": tree,
                       "role": "prompter", "text": g.text(110, 1.0), "lang": "en",
                       "deleted": False, "rank": None}
                frontier.append((mid, "prompter", depth + 1))
        if t % every == every // 2 and t // every < broken:
            yield {"message_id": f"{tree}-x", "parent_id": f"{tree}-missing",
                   "message_tree_id": tree, "role": "assistant", "text": "orphan",
                   "lang": "en", "deleted": False, "rank": 0}


def write_sources(folder: Path, n: int, seed: int = 0,
                  broken_per_source: int | None = None) -> list[Source]:
    """Write the six files for a mix of about n records into folder; returns their plan."""
    folder.mkdir(parents=True, exist_ok=True)
    g = Gen(seed)
    rng = g.rng
    srcs = plan_sources(n)
    broken = broken_per_source if broken_per_source is not None else 3 + n // 50_000
    by = {s.name: s for s in srcs}
    # Prompt-only sources first, so that later ones (and OpenOrca's empty-system rows) can
    # repeat their prompts.
    s = by["evol_codealpaca"]
    _write_jsonl(folder / s.file, ({"instruction": g.prompt(420), "output": g.text(1700, 0.8)}
                                   for _ in range(s.rows)), rng, broken, s.rows)
    s = by["codealpaca"]
    _write_jsonl(folder / s.file, ({"instruction": g.prompt(75, 0.6),
                                    "input": g.text(55, 0.7) if rng.random() < 0.4 else "",
                                    "output": g.text(190, 0.9)} for _ in range(s.rows)),
                 rng, broken, s.rows)
    s = by["magicoder"]
    _write_jsonl(folder / s.file, ({"lang": rng.choice(["python", "rust", "java", "cpp"]),
                                    "seed": g.text(300, 0.5), "problem": g.prompt(760, 0.6),
                                    "solution": g.text(1100, 0.7)} for _ in range(s.rows)),
                 rng, broken, s.rows)
    s = by["lima"]
    _write_jsonl(folder / s.file, ({"conversations": [g.prompt(330, 1.0), g.text(2400, 0.7)],
                                    "source": rng.choice(["stackexchange", "wikihow", "nlp"])}
                                   for _ in range(s.rows)), rng, broken, s.rows)
    s = by["oasst"]
    _write_jsonl(folder / s.file, _oasst_rows(g, s.rows, broken), rng, 0, s.rows)
    s = by["openorca"]
    _openorca(g, folder / s.file, s.rows, broken)
    return srcs
