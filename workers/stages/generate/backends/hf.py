"""transformers backend: batched `generate` with left padding, on CPU or one GPU.

Requests are sorted by prompt length before batching so a batch pads little. The KV cache
is transformers' default dynamic one: a static cache (docs/FIELD-NOTES.md suggests it) measured 5-10%
slower in CPU time on the tiny Qwen3 with transformers 5.19 (batch 32, 64 and 256 new
tokens), and hybrid targets (Qwen3.5 gated-delta-net layers) need their own cache anyway.
Sampling is seeded per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.stages.generate.backends.base import (
    GenerateBackend,
    GenRequest,
    GenResult,
    OnResult,
    SamplingConfig,
    truncate_at_stop,
)


class HFBackend(GenerateBackend):
    name = "hf"

    def __init__(self, model_path: str, tokenizer, sampling: SamplingConfig, batch_size: int,
                 device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.torch = torch
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.batch_size = batch_size
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # bf16 on GPU as served; fp32 on CPU where bf16 matmuls are slow and inexact.
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model.to(self.device).eval()
        # Replace the model's own generation defaults (Qwen ships top_k=20, temperature 0.6):
        # the stage's sampling params are the whole story, as with vLLM --generation-config vllm.
        self.model.generation_config = GenerationConfig(
            eos_token_id=list(sampling.eos_token_ids), pad_token_id=self._pad_id())
        cfg = self.model.config.get_text_config()
        self.context_len = getattr(cfg, "max_position_embeddings", None)

    def _pad_id(self) -> int:
        tok = self.tokenizer
        if tok.pad_token_id is not None:
            return tok.pad_token_id
        return self.sampling.eos_token_ids[0]  # only ever sits left of a prompt or after EOS

    def generate(self, requests: Sequence[GenRequest],
                 on_result: OnResult | None = None) -> list[GenResult]:
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        results: list[GenResult | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            for i, res in zip(idx, self._generate_batch([requests[i] for i in idx])):
                results[i] = res
                if on_result is not None:
                    on_result(res)
        return results  # type: ignore[return-value]

    def _generation_config(self, max_new: int):
        from transformers import GenerationConfig

        s = self.sampling
        kw = dict(max_new_tokens=max_new, eos_token_id=list(s.eos_token_ids),
                  pad_token_id=self._pad_id())
        if s.greedy:
            kw["do_sample"] = False
        else:
            # top_k=0 disables HF's default top-k of 50: only top_p filters, as in vLLM.
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
        if s.stop:
            kw["stop_strings"] = list(s.stop)
        return GenerationConfig(**kw)

    def _generate_batch(self, reqs: list[GenRequest]) -> list[GenResult]:
        torch = self.torch
        width = max(len(r.prompt_ids) for r in reqs)
        pad = self._pad_id()
        # Left padding: every prompt ends at column width-1, so new tokens line up. [B, W]
        input_ids = torch.full((len(reqs), width), pad, dtype=torch.long)
        attention = torch.zeros((len(reqs), width), dtype=torch.long)
        for row, r in enumerate(reqs):
            n = len(r.prompt_ids)
            input_ids[row, width - n:] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention[row, width - n:] = 1
        max_new = max(r.max_tokens for r in reqs)
        if not self.sampling.greedy:
            torch.manual_seed(reqs[0].seed)
        out = self._run(input_ids.to(self.device), attention.to(self.device), max_new)
        new = out[:, width:].tolist()  # [B, T] generated ids, pad after a row's EOS
        return [self._finish(r, ids) for r, ids in zip(reqs, new)]

    def _run(self, input_ids, attention, max_new: int):
        kwargs = dict(input_ids=input_ids, attention_mask=attention)
        if self.sampling.stop:
            kwargs["tokenizer"] = self.tokenizer  # stop_strings needs it
        with self.torch.inference_mode():
            return self.model.generate(**kwargs, generation_config=self._generation_config(max_new))

    def _finish(self, req: GenRequest, ids: list[int]) -> GenResult:
        eos = set(self.sampling.eos_token_ids)
        finish = "length"
        for j, t in enumerate(ids):
            if t in eos:
                ids, finish = ids[: j + 1], "stop"  # keep the EOS: the drafter must learn it
                break
        if len(ids) > req.max_tokens:
            ids, finish = ids[: req.max_tokens], "length"
        cut = truncate_at_stop(ids, self._decode, self.sampling.stop)
        if cut is not None:
            ids, finish = cut, "stop"
        return GenResult(key=req.key, prompt_ids=list(req.prompt_ids), completion_ids=ids,
                         text=self._decode(ids), finish_reason=finish)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self) -> None:
        self.model = None
