"""The built-in ``hf`` engine: a KV-cached multi-adapter decode loop on the policy's model.

It decodes with the policy's own model objects and parameter tensors (no copy), so a
role's new weights are in effect the moment the trainer's optimizer step writes them:
:meth:`~marft_algos.engines.base.GenerationEngine.sync_weights`, ``sleep`` and
``wake_up`` have nothing to do.

The loop runs over a left-padded batch that mixes roles/adapters in one forward per step
(peft ``adapter_names``, one name per row), with per-row temperature, top-p,
max-new-tokens and stop strings; rows finish independently and finished rows are dropped
from the batch (and its KV cache). Identical prompts of one adapter (GRPO groups,
``GenRequest.n``) are prefilled once and the cache is expanded; prompts of one adapter
that share a long prefix run it once (:mod:`marft_algos.models.prefix`). The policy's
flags ``max_batch``, ``merge_for_decode`` and ``share_prefixes`` are read at every call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from marft_algos.engines.base import GenerationEngine
from marft_algos.models.policy import train_mode
from marft_algos.models.prefix import left_pad, plan_prefixes, two_stage_forward
from marft_algos.models.sampling import GenRequest, GenResult, sample_next

if TYPE_CHECKING:
    from marft_algos.models.policy import LoadedBase

__all__ = ["HFEngine"]


class _TransposedHead(nn.Module):
    """An output projection computed as ``(W @ h.T).T`` for decoding on a CPU.

    For a few rows against a large vocabulary (8 x 576 against 49152 x 576), MKL's
    ``h @ W.T`` runs at a fraction of the memory bandwidth; the transposed product reads
    ``W`` in its storage order and is ~2x faster (the head is a quarter of a decode step
    of a 135M model). Same weight object, no copy.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` of hidden states ``[..., H]``."""
        w = self.head.weight
        out = (w @ h.reshape(-1, h.shape[-1]).t()).t()
        if self.head.bias is not None:
            out = out + self.head.bias
        return out.reshape(*h.shape[:-1], w.shape[0])


@contextlib.contextmanager
def _decode_head(owner: nn.Module) -> Iterator[None]:
    """Use :class:`_TransposedHead` as ``owner.lm_head`` for a no-grad decode on a CPU."""
    head = getattr(owner, "lm_head", None)
    hooked = isinstance(head, nn.Module) and (head._forward_hooks or head._forward_pre_hooks)
    if not isinstance(head, nn.Linear) or hooked or head.weight.device.type != "cpu":
        yield  # hooks on the head (logit processors, tests) must see its own forward
        return
    owner.lm_head = _TransposedHead(head)
    try:
        yield
    finally:
        owner.lm_head = head


def _hit_stop(tok: Any, ids: list[int], stops: list[str]) -> bool:
    """Does the decoded tail of ``ids`` contain a stop string?

    Checked after every token, so the first hit is completed by the last token. The
    tail is long enough for any stop string (a character is at most 4 byte tokens).
    """
    longest = max(len(s) for s in stops)
    tail = tok.decode(ids[-(4 * longest + 4) :], skip_special_tokens=True)
    return any(s in tail for s in stops)


class HFEngine(GenerationEngine):
    """Today's decode loop (see the module docstring), the reference engine.

    Args:
        policy: the team policy to decode with; its models, adapters, tokenizers,
            ``stats`` counter and decode flags are used in place.
    """

    name = "hf"

    # ---- the interface --------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> list[GenResult]:
        """Generate one result per request (``n`` results for a request with ``n > 1``,
        consecutively), batching all roles that share a base into one decode loop.

        Identical prompts of the same adapter are prefilled once. A request whose
        ``len(prompt) + max_new_tokens`` exceeds ``max_context`` gets
        ``finish_reason="context"`` and an empty action (counted in
        ``stats["context_overflow"]``); prompts are never truncated.
        """
        pol = self.policy
        gen = None
        if seed is not None:
            gen = torch.Generator(device=pol.device)
            gen.manual_seed(seed)
        slots: list[tuple[int, GenRequest]] = []  # (output position, request with n=1)
        pos = 0
        for req in requests:
            for _ in range(max(1, int(req.n))):
                slots.append((pos, req))
                pos += 1
        results: list[GenResult | None] = [None] * pos
        for b in pol.loaded_bases:
            mine = [(p, r) for p, r in slots if pol.loaded_base(r.role) is b]
            todo = []
            for p, r in mine:
                s = r.sampling
                if len(r.prompt_ids) == 0:
                    raise ValueError(f"empty prompt for role {r.role!r}")
                if len(r.prompt_ids) + s.max_new_tokens > b.max_context:
                    pol.stats["context_overflow"] += 1
                    results[p] = GenResult([], "", [], "context")
                elif s.max_new_tokens == 0:
                    results[p] = GenResult([], "", [], "length")
                else:
                    todo.append((p, r))
            # keep identical prompts adjacent so a chunk prefills them once
            todo.sort(key=lambda pr: (pol.adapter_of(pr[1].role) or "", tuple(pr[1].prompt_ids)))
            for start in range(0, len(todo), pol.max_batch):
                chunk = todo[start : start + pol.max_batch]
                for (p, _), res in zip(chunk, self._decode(b, [r for _, r in chunk], gen), strict=True):
                    results[p] = res
        return [r for r in results if r is not None]

    def set_adapter_weights(self, role: str, state: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state`` into ``role``'s adapter. The engine decodes with the policy's
        own tensors, so this is :meth:`TeamPolicy.load_adapter_state_dict`: the trainer
        sees the same weights."""
        self.policy.load_adapter_state_dict(role, state)

    def describe(self) -> dict[str, Any]:
        """The engine's name and the policy's decode flags."""
        pol = self.policy
        return {
            "engine": self.name,
            "max_batch": pol.max_batch,
            "merge_for_decode": pol.merge_for_decode,
            "share_prefixes": pol.share_prefixes,
        }

    # ---- the decode loop --------------------------------------------------------------
    @torch.no_grad()
    def _decode(self, b: LoadedBase, reqs: list[GenRequest], gen: torch.Generator | None) -> list[GenResult]:
        pol = self.policy
        dev = pol.device
        tok = b.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        adapter_of = {r.role: pol.adapter_of(r.role) for r in reqs}
        # ---- unique prompts (per adapter) --------------------------------------------------
        keys: dict[tuple[str | None, tuple[int, ...]], int] = {}
        src = []
        for r in reqs:
            k = (adapter_of[r.role], tuple(r.prompt_ids))
            src.append(keys.setdefault(k, len(keys)))
        uniq = list(keys)
        pol.stats["prefill_shared"] += len(reqs) - len(uniq)
        from transformers import DynamicCache

        cache = DynamicCache()
        model = b.model
        distinct = {adapter_of[r.role] for r in reqs}
        only = next(iter(distinct)) if len(distinct) == 1 else None
        with contextlib.ExitStack() as stack:
            stack.enter_context(train_mode(model, False))
            stack.enter_context(pol.autocast())
            stack.enter_context(_decode_head(b.backbone_owner))
            merged = only is not None and pol.merge_for_decode and stack.enter_context(pol.merged_adapter(b, only))
            uniq_adapters = [None if merged else a for a, _ in uniq]
            prompts = [list(p) for _, p in uniq]
            run = functools.partial(self._forward, b, cache=cache)
            logits, mask = self._prefill(run, cache, prompts, uniq_adapters, pad)
            rows = torch.tensor(src, dtype=torch.long, device=dev)
            if len(uniq) != len(reqs) or src != list(range(len(reqs))):
                cache.batch_select_indices(rows)
            logits = logits[rows]
            mask = mask[rows]
            next_pos = mask.sum(-1)  # position id of the next token
            temp = torch.tensor([r.sampling.temperature for r in reqs], dtype=torch.float32, device=dev)
            top_p = torch.tensor([r.sampling.top_p for r in reqs], dtype=torch.float32, device=dev)
            greedy = torch.tensor([r.sampling.is_greedy for r in reqs], dtype=torch.bool, device=dev)
            adapters = [None if merged else adapter_of[r.role] for r in reqs]
            live = list(range(len(reqs)))  # request index of each batch row
            out_ids: list[list[int]] = [[] for _ in reqs]
            out_lp: list[list[float]] = [[] for _ in reqs]
            finish: list[str] = ["length"] * len(reqs)
            while True:
                tokens, lps = sample_next(logits, temp, top_p, greedy, gen)
                tl, ll = tokens.tolist(), lps.tolist()
                keep: list[int] = []
                for row, ri in enumerate(live):
                    t = tl[row]
                    out_ids[ri].append(t)
                    out_lp[ri].append(ll[row])
                    s = reqs[ri].sampling
                    if t in b.eos_ids:
                        finish[ri] = "eos"
                    elif s.stop and _hit_stop(tok, out_ids[ri], s.stop):
                        finish[ri] = "stop"
                    elif len(out_ids[ri]) >= s.max_new_tokens:
                        finish[ri] = "length"
                    else:
                        keep.append(row)
                pol.stats["generated_tokens"] += len(live)
                if not keep:
                    break
                if len(keep) != len(live):  # drop finished rows from the batch and its cache
                    k = torch.tensor(keep, dtype=torch.long, device=dev)
                    cache.batch_select_indices(k)
                    mask, next_pos, tokens = mask[k], next_pos[k], tokens[k]
                    temp, top_p, greedy = temp[k], top_p[k], greedy[k]
                    live = [live[i] for i in keep]
                    adapters = [adapters[i] for i in keep]
                mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
                out = self._forward(b, ids=tokens[:, None], mask=mask, position=next_pos[:, None], cache=cache, adapters=adapters, keep=1)
                logits = out.logits[:, -1]
                next_pos = next_pos + 1
        pol.stats["requests"] += len(reqs)
        return [
            GenResult(out_ids[i], tok.decode(out_ids[i], skip_special_tokens=True), out_lp[i], finish[i])
            for i in range(len(reqs))
        ]

    def _prefill(
        self, run: Callable[..., Any], cache: Any, prompts: list[list[int]], adapters: list[str | None], pad: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``prompts`` into ``cache``; ``(last-position logits [U, V], mask [U, W])``.

        Prompts of one adapter that share a long prefix (an agent's system prompt and the
        problem before its teammates' actions) run it once (:func:`plan_prefixes`).
        """
        pol = self.policy
        plan = plan_prefixes(prompts, adapters) if pol.share_prefixes else None
        if plan is not None:
            cluster_adapters = [adapters[r] for r in plan.first_row]
            out, mask = two_stage_forward(run, cache, prompts, plan, cluster_adapters, adapters, pad, pol.device)
            pol.stats["prefill_tokens"] += plan.tokens(prompts)
            pol.stats["prefill_prefix_saved"] += sum(len(p) for p in prompts) - plan.tokens(prompts)
            return out.logits[:, -1], mask
        ids, mask = left_pad(prompts, pad)
        ids, mask = ids.to(pol.device), mask.to(pol.device)
        pol.stats["prefill_tokens"] += int(mask.sum())
        out = run(ids=ids, mask=mask, position=(mask.cumsum(-1) - 1).clamp_min(0), adapters=adapters, keep=1)
        return out.logits[:, -1], mask

    def _forward(
        self,
        b: LoadedBase,
        *,
        ids: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        cache: Any,
        adapters: list[str | None],
        keep: int,
    ) -> Any:
        """One forward with per-row adapters (peft mixed batch only when rows differ)."""
        kwargs: dict[str, Any] = dict(
            input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True, logits_to_keep=keep
        )
        if self.policy.mode == "full":
            return b.model(**kwargs)
        distinct = set(adapters)
        if len(distinct) == 1:
            (only,) = distinct
            with self.policy.use_adapter(b, only):
                return b.model(**kwargs)
        names = [a if a is not None else "__base__" for a in adapters]
        return b.model(**kwargs, adapter_names=names)
