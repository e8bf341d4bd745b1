"""The target model as the evaluator drives it: forwards that return greedy logits plus the
auxiliary hidden states a drafter reads, on a KV cache that can be rolled back.

Aux layer id i is HF `output_hidden_states[i]` (index 0 is the embeddings), except that HF's
last entry is taken after the final norm while speculators trains on the input of that norm
(docs/FIELD-NOTES.md "Hidden states"), so id N = num_hidden_layers reads the norm's input through a
forward pre-hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Step:
    logits: Any        # [1, q, vocab] float
    aux: Any           # [1, q, len(aux_ids) * hidden] float, or None when not asked for
    last_hidden: Any   # [1, q, hidden] input of the final norm, or None


class Verify:
    """The target's greedy tokens after each slot of a verify forward, the head run lazily:
    the slots the forward computed (slot 0, or all), the others together on first use."""

    def __init__(self, greedy: list[int], hidden: Any, head: Any, aux: Any):
        self._greedy = greedy
        self.hidden = hidden  # [1, q, hidden] after the final norm
        self.head = head
        self.aux = aux        # as Step.aux

    def greedy(self, i: int) -> int:
        if i >= len(self._greedy):
            import torch

            with torch.no_grad():
                rest = self.head(self.hidden[0, len(self._greedy):]).argmax(-1).tolist()
            self._greedy.extend(int(t) for t in rest)
        return self._greedy[i]


class TargetRunner:
    """One sequence at a time (batch 1), like a latency-bound serving request."""

    def __init__(self, model: Any, aux_layer_ids: list[int] | None = None):
        self.model = model
        self.aux_ids = list(aux_layer_ids or [])
        self.num_layers = int(model.config.get_text_config().num_hidden_layers)
        self._pre_norm: Any = None
        norm = model.get_decoder().norm
        norm.register_forward_pre_hook(self._capture_pre_norm)
        self.cache: Any = None

    def _capture_pre_norm(self, _module: Any, args: tuple) -> None:
        self._pre_norm = args[0]

    def new_cache(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        # Linear-attention layers (Qwen3.5 hybrids) keep a running state instead of per-token
        # keys; recording past states is what lets the cache roll back rejected draft tokens.
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()

    def forward(self, token_ids: list[int], with_hidden: bool = True,
                last_logits_only: bool = False) -> Step:
        """Run `token_ids` after what the cache holds; the cache then holds them too.

        `last_logits_only` skips the full-vocabulary head for all but the last position
        (a prefill needs only that one; docs/FIELD-NOTES.md "logits_to_keep=1").
        """
        import torch

        ids = torch.tensor([token_ids], dtype=torch.long, device=self.model.device)
        with torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             output_hidden_states=with_hidden and bool(self.aux_ids),
                             logits_to_keep=1 if last_logits_only else 0)
        self.cache = out.past_key_values
        if not (with_hidden and self.aux_ids):
            return Step(out.logits, None, None)
        return Step(out.logits, self._aux(out.hidden_states), self._pre_norm)

    def verify(self, token_ids: list[int], every_slot: bool = False) -> Verify:
        """A verify forward of [anchor, d_1..d_K]: like `forward`, but the full-vocabulary
        head runs on the anchor's position first and on the rest only when d_1 is accepted
        (`Verify.greedy`). A step that rejects its first draft, the common one for a weak
        drafter, then pays one head position instead of K + 1 (on the tiny target, whose head
        is 151,669 x 64, 9.4 ms a step instead of 15.2). `every_slot`: the head on every
        slot at once, for a step likely to accept (one call is cheaper than two then)."""
        import torch

        ids = torch.tensor([token_ids], dtype=torch.long, device=self.model.device)
        first = 0 if every_slot else torch.tensor([0], dtype=torch.long, device=self.model.device)
        with torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             output_hidden_states=True, logits_to_keep=first)
        self.cache = out.past_key_values
        # hidden_states[-1]: the final norm's output, what the head reads (the logits of
        # slot 0 are the head of hidden_states[-1][:, 0]).
        return Verify(out.logits[0].argmax(-1).tolist(), out.hidden_states[-1],
                      self.model.get_output_embeddings(), self._aux(out.hidden_states))

    def _aux(self, hs: tuple) -> Any:
        """The aux layers' hidden states side by side ([1, q, len(aux_ids) * hidden]), id N
        the final norm's input (the forward's pre-hook); None without aux layers."""
        if not self.aux_ids:
            return None
        import torch

        last = self._pre_norm
        return torch.cat([last if i == self.num_layers else hs[i] for i in self.aux_ids],
                         dim=-1)

    def rollback(self, n_tokens: int) -> None:
        """Forget the last `n_tokens` tokens (rejected draft tokens) from the cache."""
        # crop(-n) removes n tokens; crop(0) also lets recording layers drop saved states.
        self.cache.crop(-n_tokens if n_tokens > 0 else 0)

    def full_forward(self, token_ids: list[int]) -> Step:
        """A cache-less forward over a whole sequence (teacher forcing)."""
        saved, self.cache = self.cache, None
        try:
            import torch

            ids = torch.tensor([token_ids], dtype=torch.long, device=self.model.device)
            with torch.no_grad():
                out = self.model(input_ids=ids, use_cache=False, output_hidden_states=True)
            return Step(out.logits, self._aux(out.hidden_states), self._pre_norm)
        finally:
            self.cache = saved


def device_and_dtype() -> tuple[str, Any]:
    """CUDA in bfloat16 when a GPU is visible (a GPU box's leased device), else CPU float32."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def load_target(path: str | Path, device: str = "cpu", dtype: Any = None) -> Any:
    """The target with SDPA attention in eval mode, on `device` (float32 by default)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32,
                                                 attn_implementation="sdpa",
                                                 local_files_only=True)
    return model.to(device).eval().requires_grad_(False)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends generation (config, generation config, tokenizer)."""
    out: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            out.add(e)
        elif isinstance(e, (list, tuple)):
            out.update(int(x) for x in e)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        out.add(int(tokenizer.eos_token_id))
    return out
