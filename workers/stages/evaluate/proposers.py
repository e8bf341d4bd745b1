"""Drafters as proposers: given the target's hidden states so far, propose the next tokens.

Built from the speculators model's own modules (embeddings, fc, decoder layers, norms, heads),
so a checkpoint is evaluated exactly as it was trained; the wiring follows what speculators
trains, read from `speculators/models/dflash/core.py` and `models/eagle3/core.py`:

- DFlash (block diffusion): the target's aux hidden states for positions < p, projected by
  `fc` + `hidden_norm`, are injected as extra keys/values; the query block is
  [anchor token at p, mask, ..., mask] at positions p..p+K, attending non-causally to the
  whole context and to itself; slot i (i >= 1) predicts the token at p + i. All K tokens come
  from one forward.
- EAGLE-3 (autoregressive over its own hidden states, "training-time test"): slot j takes the
  token at j + 1 and the target's projected hidden state at j, and predicts the token at
  j + 2; step k >= 1 feeds the previous step's prediction and output hidden state back in at
  the next position, attending to every step-0 slot and to its own earlier steps.

- P-EAGLE (parallel EAGLE, `models/peagle/core.py`): EAGLE-3's step 0 over the context,
  plus K-1 slots after it holding the mask token and the learned `mask_hidden` in place of
  a token and a hidden state; slot T-1+d predicts the token at T+1+d. Causal attention over
  the context and the slots reproduces its training mask for a single rollout, so all K
  tokens come from one forward.

- DSpark (`models/dspark/core.py`): DFlash's block with the anchor slot drafting too
  (slot i predicts the token at p + i + 1), plus a Markov logit bias from the token before
  each slot, applied in order over the block.

- MTP (`models/mtp/core.py`): the target's own multi-token-prediction layer over the
  target's last hidden states, unrolled one step per draft token (MTPProposer).

All map draft-vocabulary ids to target ids through d2t (`target = draft + d2t[draft]`).
"""

from __future__ import annotations

from typing import Any

from contracts.drafters import DRAFTERS, Impl
from workers.stages.common import StageError


def _to_target(model: Any, draft_ids: Any) -> Any:
    if getattr(model, "use_draft_vocab", False):
        return draft_ids + model.d2t[draft_ids]
    return draft_ids


def check_window(model: Any, context_len: int) -> None:
    """Sliding-window layers (speculators' default window is 2,048) attend like full
    attention while the context fits the window, so evaluation is exact there; beyond it
    this evaluator does not implement windowed attention and says so."""
    win = getattr(model, "sliding_window", None)
    if getattr(model, "uses_sliding_window_attn", False) and win and context_len > win:
        raise StageError("unsupported_drafter", f"the context reached {context_len} tokens, "
                         f"beyond the drafter's sliding window of {win}; evaluate does not "
                         "implement windowed attention (use shorter prompts or max_new_tokens)")


class DFlashProposer:
    kind = Impl.DFLASH
    # Whether the anchor slot drafts too (speculators' sample_from_anchor): slot i then
    # predicts the token at p + i + 1, and a block of K slots drafts K tokens.
    from_anchor = False

    def __init__(self, model: Any, num_spec: int | None = None):
        if bool(model.config.sample_from_anchor) != self.from_anchor:
            raise StageError("unsupported_drafter", f"{model.config.speculators_model_type} "
                             f"with sample_from_anchor={model.config.sample_from_anchor} is "
                             "not supported by evaluate")
        self.m = model
        self.first = 0 if self.from_anchor else 1  # the first drafting slot of a block
        self.num_spec = int(num_spec or model.block_size - self.first)
        self.ctx: Any = None

    def reset(self) -> None:
        self.ctx = None

    def extend(self, aux: Any) -> None:
        """Append the target's aux hidden states of newly committed positions."""
        import torch

        proj = self.m.hidden_norm(self.m.fc(aux))  # shape: [1, q, hidden]
        self.ctx = proj if self.ctx is None else torch.cat([self.ctx, proj], dim=1)
        check_window(self.m, self.ctx.shape[1] + self.num_spec + 1)

    def propose(self, tokens: list[int]) -> list[int]:
        """K tokens after `tokens[-1]` (the anchor, whose hidden state is not in the context)."""
        import torch

        m, bs = self.m, self.num_spec + self.first
        t = self.ctx.shape[1]
        dev = self.ctx.device
        block = torch.full((1, bs), m.mask_token_id, dtype=torch.long, device=dev)
        block[0, 0] = tokens[-1]
        with torch.no_grad():
            h = m.embed_tokens(block)  # shape: [1, bs, hidden]
            pos = torch.arange(t + bs, device=dev).unsqueeze(0)  # context 0..t-1, block t..
            pe = m.rotary_emb(h, pos)
            # No mask: the block sees all of the context and itself (non-causal attention).
            for layer in m.layers:
                h = layer(hidden_states=h, target_hidden=self.ctx, attention_mask=None,
                          position_ids=pos, position_embeddings=pe, use_cache=False)
            h = m.norm(h[:, self.first:])  # shape: [1, K, hidden]
            prev = torch.tensor([tokens[-1]], dtype=torch.long, device=dev)
            return self._pick(h, m.lm_head(h), prev)[0].tolist()

    def _pick(self, hidden: Any, logits: Any, anchor: Any) -> Any:
        """Greedy draft ids [A, K] (target ids) from the blocks' drafting slots: hidden
        [A, K, hidden] after the final norm, logits [A, K, draft_vocab], anchor [A]."""
        return _to_target(self.m, logits.argmax(-1))

    def teacher_forced(self, aux: Any, input_ids: Any, anchors: Any) -> Any:
        """Predictions [A, K] (target ids) for blocks anchored at `anchors` of one sequence.

        aux: [1, T, L*hidden] for the whole sequence; input_ids: [T]; anchors: [A] positions.
        Block j sees context positions < anchors[j] and its own block, as in training.
        """
        import torch

        m, bs = self.m, self.num_spec + self.first
        t, a = aux.shape[1], anchors.numel()
        dev = aux.device
        with torch.no_grad():
            ctx = m.hidden_norm(m.fc(aux))  # shape: [1, T, hidden]
            tokens = torch.full((1, a * bs), m.mask_token_id, dtype=torch.long, device=dev)
            tokens[0, ::bs] = input_ids[anchors]
            q_anchor = anchors.repeat_interleave(bs)  # shape: [A*bs]
            q_pos = (anchors[:, None] + torch.arange(bs, device=dev)[None, :]).reshape(-1)
            pos = torch.cat([torch.arange(t, device=dev), q_pos]).unsqueeze(0)  # [1, T + A*bs]
            see_ctx = torch.arange(t, device=dev)[None, :] < q_anchor[:, None]  # [A*bs, T]
            blk = torch.arange(a * bs, device=dev) // bs
            see_blk = blk[:, None] == blk[None, :]  # shape: [A*bs, A*bs]
            mask = torch.cat([see_ctx, see_blk], dim=1)[None, None]  # [1, 1, A*bs, T + A*bs]
            h = m.embed_tokens(tokens)
            pe = m.rotary_emb(h, pos)
            for layer in m.layers:
                h = layer(hidden_states=h, target_hidden=ctx, attention_mask=mask,
                          position_ids=pos, position_embeddings=pe, use_cache=False)
            h = m.norm(h).view(a, bs, -1)[:, self.first:]  # shape: [A, K, hidden]
            return self._pick(h, m.lm_head(h), input_ids[anchors])


class DSparkProposer(DFlashProposer):
    """DFlash's block forward with every slot drafting, then the Markov head's logit bias
    applied slot by slot as DSpark infers (`models/dspark/core.py`): slot k's bias comes
    from the token before it in the block (the anchor for slot 0, else slot k-1's greedy
    draft), so each slot conditions on what the block drafted so far. The confidence head
    only estimates acceptance and does not change a greedy draft."""

    kind = Impl.DSPARK
    from_anchor = True

    def _pick(self, hidden: Any, logits: Any, anchor: Any) -> Any:
        import torch

        head = self.m.markov_head
        if head is None:  # markov_rank 0: pure DFlash drafting
            return super()._pick(hidden, logits, anchor)
        prev = anchor[:, None]  # shape: [A, 1], target ids
        with torch.no_grad():
            for k in range(logits.shape[1]):
                # The head's own block bias over the block so far ("rnn" carries a state).
                bias = head.block_bias(prev_token_ids=prev, hidden_states=hidden[:, :k + 1])
                tok = _to_target(self.m, (logits[:, k] + bias[:, k]).argmax(-1))  # [A]
                prev = torch.cat([prev, tok[:, None]], dim=1)
        return prev[:, 1:]


class Eagle3Proposer:
    kind = Impl.EAGLE3

    def __init__(self, model: Any, num_spec: int | None = None):
        self.m = model
        trained = model.config.speculators_config.proposal_methods[0].speculative_tokens
        self.num_spec = int(num_spec or trained)
        self.ctx: Any = None

    def reset(self) -> None:
        self.ctx = None

    def _project(self, aux: Any) -> Any:
        """fc over the aux hidden states, with the optional norms the config asks for."""
        import torch

        m = self.m
        if m.input_norm is not None:
            aux = m.input_norm(aux)
        if m.fc_norm is not None:
            chunks = aux.chunk(len(m.fc_norm), dim=-1)
            aux = torch.cat([n(c) for n, c in zip(m.fc_norm, chunks, strict=True)], dim=-1)
        return m.fc(aux)

    def extend(self, aux: Any) -> None:
        import torch

        with torch.no_grad():
            proj = self._project(aux)  # shape: [1, q, hidden]
        self.ctx = proj if self.ctx is None else torch.cat([self.ctx, proj], dim=1)
        check_window(self.m, self.ctx.shape[1] + self.num_spec + 1)

    def propose(self, tokens: list[int]) -> list[int]:
        """K tokens after `tokens` (len T + 1: positions 0..T, hidden states known for 0..T-1)."""
        import torch
        from transformers import DynamicCache

        m = self.m
        t, dev = self.ctx.shape[1], self.ctx.device
        in_ids = torch.tensor([tokens[1:t + 1]], dtype=torch.long, device=dev)  # j+1 for slot j
        pos = torch.arange(1, t + 1, device=dev).unsqueeze(0)
        hidden = self.ctx
        cache = DynamicCache()
        out: list[int] = []
        with torch.no_grad():
            for _ in range(self.num_spec):
                hs = torch.cat([m.embed_tokens(in_ids), hidden], dim=-1)  # [1, q, 2*hidden]
                pe = m.rotary_emb(hs, pos)
                start = cache.get_seq_length()
                cache_pos = torch.arange(start, start + hs.shape[1], device=dev)
                # Step 0 (q = T) is causal over the slots (SDPA's is_causal when no mask is
                # given); later steps (q = 1) see every cached slot and their own steps.
                for layer in m.layers:
                    hs = layer(hs, attention_mask=None, position_ids=pos, past_key_values=cache,
                               cache_position=cache_pos, position_embeddings=pe)
                last = hs[:, -1:]
                if m.config.norm_output:
                    last = m.norm(last)
                    logits = m.lm_head(last)
                else:
                    logits = m.lm_head(m.norm(last))
                tok = int(_to_target(m, logits.argmax(-1))[0, 0])
                out.append(tok)
                in_ids = torch.tensor([[tok]], dtype=torch.long, device=dev)
                pos = pos[:, -1:] + 1
                hidden = last
        return out

    def teacher_forced(self, aux: Any, input_ids: Any, anchors: Any) -> Any:
        """Predictions [A, K] (target ids) for draft steps anchored at `anchors`.

        Runs speculators' own training forward (teacher-forced TTT) once over the sequence;
        the step anchored at position p is slot p - 1 of the shifted sequence.
        """
        import torch

        m, k = self.m, self.num_spec
        t, dev = input_ids.numel(), aux.device
        with torch.no_grad():
            drafts = m(hidden_states=aux[:, :-1], input_ids=input_ids[None, 1:],
                       document_ids=torch.zeros(1, t - 1, dtype=torch.long, device=dev),
                       position_ids=torch.arange(1, t, device=dev).unsqueeze(0), ttt_steps=k)
        steps = torch.stack([_to_target(m, d[0]) for d in drafts], dim=1)  # shape: [T-1, K]
        # Step s at slot j predicts the token at j + 2 + s; anchor p is slot p - 1.
        return steps[anchors - 1]


class PEagleProposer(Eagle3Proposer):
    kind = Impl.PEAGLE

    def _forward(self, in_ids: Any, hidden: Any, pos: Any) -> Any:
        """Logits [1, q, draft_vocab] of the slots (causal: SDPA's is_causal, no mask)."""
        import torch

        m = self.m
        hs = torch.cat([m.embed_tokens(in_ids), hidden], dim=-1)  # shape: [1, q, 2*hidden]
        pe = m.rotary_emb(hs, pos)
        for layer in m.layers:
            hs = layer(hs, attention_mask=None, position_ids=pos, position_embeddings=pe)
        return m.lm_head(m.norm(hs))

    def _mask_slots(self, n: int) -> tuple[Any, Any]:
        """(token ids [1, n], projected hidden [1, n, hidden]) of n parallel-draft slots."""
        import torch

        m, dev = self.m, self.ctx.device
        ids = torch.full((1, n), m.mask_token_id, dtype=torch.long, device=dev)
        hidden = self._project(m.mask_hidden.to(self.ctx.dtype)).expand(1, n, -1)
        return ids, hidden

    def propose(self, tokens: list[int]) -> list[int]:
        """K tokens after `tokens` (len T + 1: positions 0..T, hidden states known for 0..T-1)."""
        import torch

        t, k, dev = self.ctx.shape[1], self.num_spec, self.ctx.device
        # Slot j holds token j + 1 and hidden state j, as in training (shifted samples);
        # positions count slots from 0, as P-EAGLE's training forward does.
        ids, hidden = self._mask_slots(k - 1)
        in_ids = torch.cat([torch.tensor([tokens[1:t + 1]], dtype=torch.long, device=dev),
                            ids], dim=1)
        with torch.no_grad():
            hid = torch.cat([self.ctx, hidden], dim=1)  # shape: [1, T + K - 1, hidden]
            pos = torch.arange(t + k - 1, device=dev).unsqueeze(0)
            logits = self._forward(in_ids, hid, pos)[:, t - 1:]  # shape: [1, K, draft_vocab]
            return _to_target(self.m, logits.argmax(-1))[0].tolist()

    def teacher_forced(self, aux: Any, input_ids: Any, anchors: Any) -> Any:
        """Predictions [A, K] (target ids) for drafts anchored at `anchors`: one forward per
        anchor over its context and K-1 mask slots (what `propose` runs there)."""
        import torch

        out = []
        with torch.no_grad():
            proj = self._project(aux)  # shape: [1, T, hidden]
        for p in anchors.tolist():
            self.ctx = proj[:, :p]
            out.append(self.propose(input_ids[:p + 1].tolist()))
        self.ctx = None
        return torch.tensor(out, dtype=torch.long, device=aux.device).view(-1, self.num_spec)


class MTPProposer:
    """The target's MTP layer unrolled as speculators trains it (`models/mtp/core.py`):
    step 0 runs over every context slot j with the target's hidden state at j (the input
    of its final norm) and the token at j + 1, predicting the token at j + 2; step k runs
    over the same slots with step k-1's outputs and the tokens at j + k + 1 (drafts past
    the anchor), causal over the slots. The last slot's prediction at step k is draft k."""

    kind = Impl.MTP

    def __init__(self, model: Any, num_spec: int | None = None):
        self.m = model
        self.num_spec = int(num_spec or model.config.num_speculative_steps)
        self.ctx: Any = None

    def reset(self) -> None:
        self.ctx = None

    def extend(self, aux: Any) -> None:
        """Append the target's last hidden states (aux layer N) of committed positions."""
        import torch

        self.ctx = aux if self.ctx is None else torch.cat([self.ctx, aux], dim=1)

    def propose(self, tokens: list[int]) -> list[int]:
        """K tokens after `tokens` (len T + 1: positions 0..T, hidden states known for 0..T-1)."""
        import torch
        from speculators.models.mtp.core import _prepare_mtp_position_ids
        from transformers.masking_utils import create_causal_mask

        m, hidden = self.m, self.ctx
        t, dev = hidden.shape[1], hidden.device
        tc = m.config.transformer_layer_config
        pos, rot = _prepare_mtp_position_ids(torch.arange(t, device=dev).unsqueeze(0), t,
                                             tc.model_type)
        seq = list(tokens[:t + 1])
        with torch.no_grad():
            mask = create_causal_mask(config=tc, inputs_embeds=hidden, attention_mask=None,
                                      past_key_values=None, position_ids=pos)
            for k in range(self.num_spec):
                emb = m.embed_tokens(torch.tensor([seq[k + 1:k + 1 + t]], device=dev))
                hidden = m.mtp_layers[0](hidden_states=hidden, token_embeddings=emb,
                                         attention_mask=mask, position_ids=pos,
                                         position_embeddings=m.rotary_emb(hidden, rot))
                seq.append(int(m.lm_head(hidden[:, -1]).argmax(-1)[0]))
        return seq[t + 1:]

    def teacher_forced(self, aux: Any, input_ids: Any, anchors: Any) -> Any:
        """Predictions [A, K] for drafts anchored at `anchors`: `propose` over each
        anchor's context."""
        import torch

        out = []
        for p in anchors.tolist():
            self.ctx = aux[:, :p]
            out.append(self.propose(input_ids[:p + 1].tolist()))
        self.ctx = None
        return torch.tensor(out, dtype=torch.long, device=aux.device).view(-1, self.num_spec)


Proposer = DFlashProposer | Eagle3Proposer | MTPProposer

# A drafter type's evaluate key (contracts/drafters.py `evaluate`) -> how it drafts.
PROPOSERS: dict[str, type[Proposer]] = {
    Impl.DFLASH: DFlashProposer, Impl.EAGLE3: Eagle3Proposer, Impl.PEAGLE: PEagleProposer,
    Impl.DSPARK: DSparkProposer, Impl.MTP: MTPProposer}


def make_proposer(model: Any, num_spec: int | None = None) -> Proposer:
    kind = model.config.speculators_model_type
    if kind not in DRAFTERS or DRAFTERS[kind].evaluate not in PROPOSERS:
        raise StageError("unsupported_drafter", f"drafter type {kind!r} is not supported")
    return PROPOSERS[DRAFTERS[kind].evaluate](model, num_spec)
