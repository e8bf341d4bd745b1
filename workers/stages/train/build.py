"""Build the speculators draft model (a type of contracts/drafters.py) for a `TrainJob`, with
speculators' own constructors: `create_transformer_layer_config` (the decoder shaped from
the target config), `build_vocab_mappings_from_distribution` (d2t/t2d),
`<Model>.from_training_args` (config + verifier embeddings/lm_head/norm) and
`<Model>.get_trainer_kwargs` (loss config per type). Nothing here touches a device.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from contracts.drafters import SERVED_TARGET, Impl, drafter
from workers.stages.train.job import TrainJob

# speculators' defaults for the decoder (TrainConfig): every draft layer uses sliding-window
# attention of 2,048 unless listed as full attention; the decoder architecture is the drafter
# type's (contracts/drafters.py draft_arch: EAGLE-3 a llama decoder with norm-before-fc and
# norm-output, DFlash a qwen3 decoder).
SLIDING_WINDOW = 2048
DFLASH_DECAY_GAMMA = 4.0
DPACE_ALPHA = 0.5


def vocab_mapping(job: TrainJob):
    """(d2t, t2d) for a reduced draft vocabulary, or (None, None) for the full one.

    Prefers the d2t/t2d files the prepare stage may have cached (speculators' data layout),
    else builds them from token_freq.pt the way `speculators train` does."""
    import numpy as np
    import torch
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    n = job.draft_vocab_size
    if n >= job.vocab_size:
        return None, None
    base = Path(job.tokenized_path)
    d2t_file, t2d_file = base / f"d2t-{n}.npy", base / f"t2d-{n}.npy"
    if d2t_file.is_file() and t2d_file.is_file():
        d2t = torch.from_numpy(np.load(d2t_file))
        t2d = torch.from_numpy(np.load(t2d_file))
        if d2t.shape[0] == n and t2d.shape[0] == job.vocab_size:
            return d2t, t2d
    freq = torch.load(base / "token_freq.pt", weights_only=True)
    freq = {int(k): int(v) for k, v in freq.items()}
    return build_vocab_mappings_from_distribution(
        token_freq_dict=freq, draft_vocab_size=n, target_vocab_size=job.vocab_size)


def model_kwargs(job: TrainJob) -> dict:
    """The flat kwargs speculators' `from_training_args` reads (its `vars(args)` shape)."""
    d = job.p.drafter
    kw = {
        "verifier_name_or_path": job.target_path,
        "target_layer_ids": list(job.layer_ids),
        "draft_attn_impl": job.attention,
        "draft_vocab_size": job.draft_vocab_size,
    }
    return {**kw, **RECIPES[drafter(d.type).train](job)}


def _dflash_kwargs(job: TrainJob) -> dict:
    return {"block_size": job.p.drafter.block_size, "mask_token_id": job.mask_token_id}


def _eagle3_kwargs(job: TrainJob) -> dict:
    return {"ttt_steps": job.p.drafter.ttt_steps, "norm_before_residual": True,
            "norm_before_fc": True, "fc_norm": False, "norm_output": True,
            "embed_requires_grad": False}


def _peagle_kwargs(job: TrainJob) -> dict:
    # speculators' defaults for P-EAGLE (train/config/schema.py): no norm before fc or on
    # the output; its config trains the embeddings (PEagleSpeculatorConfig).
    return {"num_depths": job.p.drafter.num_depths, "mask_token_id": job.mask_token_id,
            "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False}


def _dspark_kwargs(job: TrainJob) -> dict:
    # speculators' DSpark defaults: every slot drafts (sample_from_anchor), a vanilla Markov
    # head of rank 256 and the confidence head (DSparkDraftModel.from_training_args).
    return {**_dflash_kwargs(job), "sample_from_anchor": True}


def _mtp_kwargs(job: TrainJob) -> dict:
    # The MTP layer's weights come from the target checkpoint (speculators' MTPConverter,
    # inside from_training_args); it takes no draft vocabulary and no mask token.
    return {"num_speculative_steps": job.p.drafter.num_speculative_steps}


# A drafter type's train recipe (contracts/drafters.py `train`) -> its model kwargs.
RECIPES: dict[str, Callable[[TrainJob], dict]] = {
    Impl.DFLASH: _dflash_kwargs, Impl.EAGLE3: _eagle3_kwargs, Impl.PEAGLE: _peagle_kwargs,
    Impl.DSPARK: _dspark_kwargs, Impl.MTP: _mtp_kwargs}


def build_model(job: TrainJob):
    """A freshly initialised draft model on CPU (the caller seeds torch first)."""
    from speculators.model import SpeculatorModel
    from speculators.train.cli import create_transformer_layer_config

    d = job.p.drafter
    model_class = SpeculatorModel.registry[d.type]
    if drafter(d.type).target_mtp:  # the target's own decoder config and MTP weights
        from speculators.models.utils import get_verifier_config

        return model_class.from_training_args(
            verifier_config=get_verifier_config(job.target_path), **model_kwargs(job))
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=job.target_path, num_layers=d.num_layers,
        draft_arch=drafter(d.type).draft_arch, hidden_act=None, sliding_window=SLIDING_WINDOW,
        full_attention_indices=[])
    d2t, t2d = vocab_mapping(job)
    return model_class.from_training_args(verifier_config=layer_config, t2d=t2d, d2t=d2t,
                                          **model_kwargs(job))


def loss_implementation(device_type: str) -> str:
    """The fused losses need Triton (GPU); CPU uses speculators' eager reference losses."""
    if device_type != "cuda":
        return "eager"
    from importlib.util import find_spec

    return "fused" if find_spec("triton") is not None else "eager"


def trainer_kwargs(job: TrainJob, device_type: str) -> dict:
    """Forward kwargs for the training step, from the model class (as speculators' CLI)."""
    from speculators.model import SpeculatorModel

    p = job.p
    d = p.drafter
    loss_fn = p.loss_fn
    kwargs = {
        "loss_fn": loss_fn, "loss_implementation": loss_implementation(device_type),
        "per_position_loss_weight": p.dflash_weighting,
        "dflash_decay_gamma": DFLASH_DECAY_GAMMA, "dpace_alpha": DPACE_ALPHA,
        "max_anchors": d.num_anchors or 512, "ttt_steps": d.ttt_steps or 1,
        "ttt_step_loss_decay": 1.0, "num_depths": d.num_depths or 8,
        "num_speculative_steps": d.num_speculative_steps or 3,
    }
    train_kwargs, _val = SpeculatorModel.registry[d.type].get_trainer_kwargs(**kwargs)
    return train_kwargs


def preprocess_fn(job: TrainJob):
    """Per-sample shift the EAGLE family needs before packing (speculators' `shift_batch`);
    MTP reads the input of the final norm as its hidden states (`shift_batch_mtp`)."""
    d = drafter(job.p.drafter.type)
    if d.target_mtp:
        from speculators.models.mtp.data import shift_batch_mtp

        return shift_batch_mtp
    if not d.shifted:
        return None
    from speculators.models.eagle3.data import shift_batch

    return shift_batch


def vllm_speculative_config(drafter_dir: str | Path) -> dict:
    """vLLM's --speculative-config for a saved speculators checkpoint."""
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    spec = cfg["speculators_config"]
    proposal = next((m for m in spec.get("proposal_methods", [])
                     if m.get("proposal_type") == spec.get("default_proposal_method")),
                    (spec.get("proposal_methods") or [{}])[0])
    return drafter(cfg["speculators_model_type"]).speculative_config(
        int(proposal["speculative_tokens"]))


def vllm_serve_command(target_path: str, drafter_path: str, spec_config: dict,
                       drafter_type: str = "") -> str:
    """`vllm serve <target> --speculative-config '{...}'`: the long form, which names the
    target explicitly (the short form `vllm serve <drafter>` reads the verifier path from
    the checkpoint, which may not exist where vLLM runs). A type trained from the target's
    own MTP layers is served as the target, with the trained layers in place: the
    drafter's `served_target/` (`write_served_target`), and no draft model."""
    if drafter_type and drafter(drafter_type).target_mtp:
        served = f"{drafter_path}/{SERVED_TARGET}"
        return (f"vllm serve {shlex.quote(served)} "
                f"--speculative-config {shlex.quote(json.dumps(spec_config))}")
    cfg = {"model": str(drafter_path), **spec_config}
    return (f"vllm serve {shlex.quote(str(target_path))} "
            f"--speculative-config {shlex.quote(json.dumps(cfg))}")


# speculators' MTP names -> the native ones of a Qwen3.5/3.6 checkpoint (the inverse of
# speculators' convert/mtp/converter.py maps), which vLLM's MTP model loads.
_MTP_NATIVE = [("mtp_layers.0.input_proj.", "mtp.fc."),
               ("mtp_layers.0.final_layernorm.", "mtp.norm."),
               ("mtp_layers.0.hidden_layernorm.", "mtp.pre_fc_norm_hidden."),
               ("mtp_layers.0.token_layernorm.", "mtp.pre_fc_norm_embedding."),
               ("mtp_layers.0.", "mtp.layers.0.")]


def _native_mtp_name(key: str) -> str:
    for ours, native in _MTP_NATIVE:
        if key.startswith(ours):
            return native + key[len(ours):]
    raise ValueError(f"not an MTP layer weight: {key}")


def write_served_target(target_path: str | Path, drafter_dir: str | Path) -> Path:
    """`served_target/` beside a trained MTP drafter: the target checkpoint vLLM serves with
    method `mtp`, whose MTP layers are the trained ones. vLLM reads MTP weights from the
    target's own checkpoint (its qwen3_5 MTP model loads the `mtp.*` tensors), so every
    file of the target is linked in unchanged except the safetensors shards holding
    `mtp.*`: a shard of MTP weights only is replaced by the trained weights, a mixed one is
    rewritten with them; the index maps each tensor to its file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    target, drafter_dir = Path(target_path).resolve(), Path(drafter_dir)
    out = drafter_dir / SERVED_TARGET
    out.mkdir(exist_ok=True)
    trained: dict = {}
    for f in sorted(drafter_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            trained.update({_native_mtp_name(k): fh.get_tensor(k).contiguous()
                            for k in fh.keys() if k.startswith("mtp_layers.")})
    index = target / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(str(target / "model.safetensors"), framework="pt") as fh:
            weight_map = {k: "model.safetensors" for k in fh.keys()}
    stale = {fname for k, fname in weight_map.items() if k.startswith("mtp.")}
    for item in target.iterdir():
        if item.name not in stale and item.name != index.name and not item.is_dir():
            (out / item.name).symlink_to(item)
    new_map = {k: v for k, v in weight_map.items() if v not in stale}
    for fname in sorted(stale):  # tensors of a mixed shard that are not MTP's, kept
        with safe_open(str(target / fname), framework="pt") as fh:
            kept = {k: fh.get_tensor(k) for k in fh.keys() if not k.startswith("mtp.")}
        if kept:
            save_file(kept, str(out / fname), metadata={"format": "pt"})
            new_map.update(dict.fromkeys(kept, fname))
    save_file(trained, str(out / "model-mtp-trained.safetensors"), metadata={"format": "pt"})
    new_map.update(dict.fromkeys(trained, "model-mtp-trained.safetensors"))
    (out / index.name).write_text(json.dumps({"metadata": {}, "weight_map": new_map},
                                             indent=2))
    return out
