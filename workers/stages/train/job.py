"""Resolve a train stage's params and typed inputs into a `TrainJob`: checked inputs and
every derived choice (layer ids, draft vocabulary, mask token, attention) fixed once in the
stage process, so all torchrun ranks and every retry train the same thing.

Input layouts (other stages write them; see workers/stages/prepare and extract):
  tokenized      `datasets.load_from_disk` folder: input_ids, loss_mask, seq_len (+ id),
                 torch format, plus token_freq.pt ({token id: count}) and optionally
                 d2t-<N>.npy / t2d-<N>.npy.
  hidden_states  hs_{row}.safetensors with hidden_states [seq, n_aux + 1, hidden] (aux layers
                 in meta `layer_ids` order, then layer N = the input of the final norm) and
                 token_ids [seq]; meta (or meta.json) carries `layer_ids`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.drafters import drafter, target_problem
from contracts.resolved import ResolvedArtifact, TrainResolved
from contracts.target import text_config
from contracts.train import TrainParams
from workers.stages.common import StageContext, StageError
from workers.stages.extract.layers import resolve_layers, validate_layer_ids
from workers.stages.kernel import input_error, target_config

ATTENTION_IMPLS = {"sdpa": "sdpa", "eager": "eager", "flex": "simple_flex_attention"}


@dataclass
class TrainJob:
    """Everything a training process needs; JSON-serializable for torchrun workers."""

    params: dict
    target_path: str
    tokenizer_path: str
    tokenized_path: str
    out_dir: str
    work_dir: str
    events_path: str | None
    source: str                      # "offline" | "hf" (in-process target) | "vllm"
    layer_ids: list[int]             # aux layer ids the drafter is trained on
    num_target_layers: int
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int            # == vocab_size when the full vocabulary is used
    mask_token_id: int | None
    attention: str                   # speculators' name (sdpa | eager | simple_flex_attention)
    target_dtype: str
    hidden_states_path: str | None = None
    # Positions of `layer_ids` inside the stored files (None: the files hold exactly them).
    layer_select: list[int] | None = None
    vllm_endpoint: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def p(self) -> TrainParams:
        return TrainParams.model_validate(self.params)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> TrainJob:
        return cls(**d)


def _need(cond: bool, code: str, message: str, **details: Any) -> None:
    if not cond:
        raise StageError(code, message, details or None)


def _tokenized(path: str) -> tuple[int, list[int], int]:
    """(rows, row 0's input_ids, the longest row) of the tokenized set at `path`."""
    _need(Path(path).is_dir(), "invalid_input", f"tokenized set {path} does not exist")
    from datasets import load_from_disk

    try:
        ds = load_from_disk(path)
    except Exception as e:  # noqa: BLE001  any reader failure means a bad artifact
        raise StageError("invalid_input", f"tokenized set {path} is not a datasets folder: "
                         f"{e}") from None
    missing = {"input_ids", "loss_mask", "seq_len"} - set(ds.column_names)
    _need(not missing, "invalid_input", f"tokenized set lacks columns {sorted(missing)}",
          path=path)
    _need(len(ds) > 0, "invalid_input", "tokenized set is empty", path=path)
    plain = ds.with_format(None)
    return len(ds), [int(t) for t in plain[0]["input_ids"]], max(plain["seq_len"])


def _hs_meta(hs: ResolvedArtifact) -> dict:
    meta = dict(hs.meta)
    meta_file = Path(hs.path) / "meta.json"
    if "layer_ids" not in meta and meta_file.is_file():
        meta.update(json.loads(meta_file.read_text()))
    return meta


def _offline_layers(hs_path: str, meta: dict, requested: list[int] | None, n_layers: int,
                    hidden: int, rows: int, row0: list[int]) -> tuple[list[int], list[int] | None]:
    """(aux layer ids to train on, their positions in the stored files or None)."""
    from safetensors import safe_open

    names = {e.name for e in os.scandir(hs_path) if e.name.endswith(".safetensors")}
    missing = [i for i in range(rows) if f"hs_{i}.safetensors" not in names]
    _need(not missing, "invalid_input", f"hidden_states lacks {len(missing)} of {rows} rows of "
          f"the tokenized set (first: hs_{missing[0] if missing else 0}.safetensors); they "
          "must come from the same tokenized artifact", path=hs_path)
    with safe_open(str(Path(hs_path) / "hs_0.safetensors"), framework="pt") as f:
        shape = f.get_slice("hidden_states").get_shape()  # [seq, n_aux + 1, hidden]
        tokens = f.get_tensor("token_ids").tolist()
    # speculators drops a sample whose stored tokens differ from its row; catch the case
    # where every row would be dropped (states extracted from another tokenized set).
    _need(tokens == row0, "invalid_input", "hidden_states row 0 holds other tokens than the "
          "tokenized set's row 0: they were extracted from a different tokenized artifact")
    _need(len(shape) == 3 and shape[2] == hidden, "invalid_input",
          f"hidden_states have shape {shape}; expected [seq, layers, {hidden}] for this target")
    stored = meta.get("layer_ids")
    if stored is None:
        _need(requested is not None and len(requested) == shape[1] - 1, "invalid_input",
              "hidden_states meta has no `layer_ids`; set drafter.target_layer_ids to the "
              f"{shape[1] - 1} aux layers the files hold")
        assert requested is not None  # _need raised otherwise
        stored = list(requested)
    stored = [int(i) for i in stored]
    _need(len(stored) == shape[1] - 1, "invalid_input", f"hidden_states meta lists layer_ids "
          f"{stored} but the files hold {shape[1] - 1} aux layers (+ the last)")
    want = list(requested) if requested is not None else stored
    absent = [i for i in want if i not in stored]
    _need(not absent, "invalid_params", f"drafter.target_layer_ids {absent} are not in the "
          f"hidden_states artifact (it holds {stored}); extract them or choose a subset",
          field="drafter.target_layer_ids", available=stored)
    validate_layer_ids(want, n_layers, field="drafter.target_layer_ids")  # the one rule
    return want, (None if want == stored else [stored.index(i) for i in want])


def resolve_mask_token_id(tokenizer_path: str, vocab_size: int, explicit: int | None) -> int:
    """speculators' resolution order (train.utils.resolve_mask_token_id) on our tokenizer
    path: explicit, tokenizer's mask token, a spare embedding slot, pad, eos."""
    if explicit is not None:
        _need(explicit < vocab_size, "invalid_params", f"drafter.mask_token_id {explicit} is "
              f"outside the target vocabulary ({vocab_size})", field="drafter.mask_token_id")
        return explicit
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    if len(tok) < vocab_size:
        return len(tok)  # the first unused embedding row, as speculators adds <|MASK|> there
    for tid in (tok.pad_token_id, tok.eos_token_id):
        if tid is not None:
            return int(tid)
    raise StageError("invalid_params", "cannot pick a mask token: set drafter.mask_token_id")


def _vocab_source(tokenized_path: str, draft_vocab: int) -> None:
    base = Path(tokenized_path)
    cached = (base / f"d2t-{draft_vocab}.npy").is_file() and \
        (base / f"t2d-{draft_vocab}.npy").is_file()
    _need(cached or (base / "token_freq.pt").is_file(), "invalid_input",
          f"a draft vocabulary of {draft_vocab} needs token_freq.pt (or d2t/t2d-{draft_vocab}"
          ".npy) in the tokenized set; set drafter.draft_vocab_size=null for the full vocab")


def resolve_job(params: TrainParams, inputs: TrainResolved, ctx: StageContext, source: str,
                cuda: bool, warn=lambda msg: None) -> TrainJob:
    """Check inputs and fix every derived choice. `source`: offline | hf | vllm."""
    target_path, tokenizer_path = inputs.target.path, inputs.target.tokenizer
    cfg = text_config(target_config(inputs.target))
    n_layers, hidden, vocab = (cfg.get("num_hidden_layers"), cfg.get("hidden_size"),
                               cfg.get("vocab_size"))
    if not (isinstance(n_layers, int) and n_layers > 0 and isinstance(hidden, int) and hidden > 0
            and isinstance(vocab, int) and vocab > 0):
        raise StageError("invalid_input",
                         "target config lacks num_hidden_layers/hidden_size/vocab_size")
    tokenized_path = inputs.tokenized.path
    rows, row0, longest = _tokenized(tokenized_path)
    d = params.drafter
    unfit = target_problem(d.type, cfg)
    _need(unfit is None, "invalid_params", unfit or "", field="drafter.type")
    hs = inputs.hidden_states
    layer_select = None
    hs_path = None
    if source == "offline":
        if hs is None:
            raise input_error("inputs.hidden_states", "is required (mode=offline reads the "
                              "extract stage's artifact; or use mode=online)")
        hs_path = hs.path
        _need(Path(hs_path).is_dir(), "invalid_input", f"hidden_states {hs_path} does not exist")
        layer_ids, layer_select = _offline_layers(hs_path, _hs_meta(hs), d.target_layer_ids,
                                                  n_layers, hidden, rows, row0)
    else:
        if hs:
            warn("mode=online: the hidden_states input is ignored")
        # The extract stage's rule and defaults, so online and offline runs of one drafter
        # type tap the same layers.
        layer_ids = list(resolve_layers(cfg, d.type, d.target_layer_ids,
                                        field="drafter.target_layer_ids").aux)

    # MTP drafts over the target's own head: the full vocabulary whatever was asked.
    asked = None if drafter(d.type).target_mtp else d.draft_vocab_size
    draft_vocab = vocab if asked is None else asked
    _need(draft_vocab <= vocab, "invalid_params", f"drafter.draft_vocab_size {draft_vocab} "
          f"exceeds the target vocabulary ({vocab})", field="drafter.draft_vocab_size")
    if draft_vocab < vocab:
        _vocab_source(tokenized_path, draft_vocab)

    attention = params.attention or ("flex" if cuda else "sdpa")
    _need(cuda or attention != "flex", "invalid_params", "attention=flex has no CPU backward "
          "pass; use sdpa or eager on CPU", field="attention")
    # A type that takes a mask token (contracts/drafters.py options) gets one resolved.
    mask = (resolve_mask_token_id(tokenizer_path, vocab, d.mask_token_id)
            if "mask_token_id" in drafter(d.type).options.model_fields else None)
    return TrainJob(
        params=params.model_dump(mode="json"), target_path=target_path,
        tokenizer_path=tokenizer_path, tokenized_path=tokenized_path,
        out_dir=str(ctx.out_dir), work_dir=str(ctx.work_dir),
        events_path=str(ctx.events_path) if ctx.events_path else None, source=source,
        layer_ids=layer_ids,
        num_target_layers=n_layers, hidden_size=hidden, vocab_size=vocab,
        draft_vocab_size=draft_vocab, mask_token_id=mask,
        attention=ATTENTION_IMPLS[attention],
        target_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
        hidden_states_path=hs_path, layer_select=layer_select,
        extra={"rows": rows, "longest_row": longest, "job_id": ctx.job_id})
