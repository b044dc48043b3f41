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

:meth:`HFEngine.generate_stream` is the same loop with continuous batching: a running
batch per base model, which queued requests join whenever rows have finished (up to
``max_batch``). The joiners are prefilled together (identical prompts once, shared
prefixes once) into a cache of their own, which is then merged into the running
:class:`~transformers.DynamicCache` by left-padding the shorter side in the sequence
dimension (positions stay per row, the attention mask hides the padding); columns that
no running row attends to any more are cropped from the left. Rows of different adapters
mix through peft ``adapter_names``; a batch is never merged into one adapter
(``merge_for_decode`` does not apply), since the next joiner may use another.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from marft_algos.engines.base import GenerationEngine, OnDone, check_stream_request
from marft_algos.models.compat import cache_kwarg
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


@dataclass
class _Row:
    """A streamed request and what it has sampled so far."""

    key: Any
    req: GenRequest
    adapter: str | None
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)


@dataclass
class _Lane:
    """The running batch of one base model (continuous batching) and its queue.

    Row ``i`` of every tensor is ``rows[i]``; ``logits`` are the next-token logits of
    each row (from its last forward) until :meth:`HFEngine._sample_lane` consumes them,
    then ``tokens`` are the sampled tokens that the next forward feeds.
    """

    b: Any
    queue: deque[_Row] = field(default_factory=deque)
    rows: list[_Row] = field(default_factory=list)
    cache: Any = None
    mask: torch.Tensor | None = None
    next_pos: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    temp: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    greedy: torch.Tensor | None = None

    def select(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` (in this order); an empty ``keep`` clears the lane."""
        if not keep:
            self.rows, self.cache = [], None
            self.mask = self.next_pos = self.logits = self.tokens = self.temp = self.top_p = self.greedy = None
            return
        k = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(k)
        self.mask, self.next_pos = self.mask[k], self.next_pos[k]
        self.temp, self.top_p, self.greedy = self.temp[k], self.top_p[k], self.greedy[k]
        if self.tokens is not None:
            self.tokens = self.tokens[k]
        self.rows = [self.rows[i] for i in keep]
        # columns no remaining row attends to (the left padding of rows that left): crop
        first = int(self.mask.any(0).to(torch.int8).argmax())
        if first > 0 and _mergeable(self.cache):
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


def _mergeable(cache: Any) -> bool:
    """Can rows be added to ``cache`` by padding its layers (plain full-attention layers)?"""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``x`` zero-padded on the left of ``dim`` to ``width``."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class HFEngine(GenerationEngine):
    """Today's decode loop (see the module docstring), the reference engine.

    Args:
        policy: the team policy to decode with; its models, adapters, tokenizers,
            ``stats`` counter and decode flags are used in place.
        continuous_batching: whether a :class:`~marft_algos.rollout.RolloutCollector`
            built without its own setting streams its requests through
            :meth:`generate_stream` (``engine_options={"continuous_batching": true}``).
        join_fraction: in :meth:`generate_stream`, queued requests join a running batch
            of ``r`` rows once at least ``max(1, join_fraction * r)`` are waiting (or
            nothing runs): every join is one more prefill forward, and requests joining
            together share their prompt prefixes. ``0`` joins at every step.
    """

    name = "hf"

    def __init__(self, policy: Any, *, continuous_batching: bool = False, join_fraction: float = 0.25) -> None:
        super().__init__(policy)
        if not 0.0 <= join_fraction <= 1.0:
            raise ValueError(f"join_fraction must be in [0, 1], got {join_fraction}")
        #: the collector's default for ``RolloutCollector(continuous_batching=None)``
        self.continuous_batching = bool(continuous_batching)
        self.join_fraction = float(join_fraction)

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

    def generate_stream(
        self, requests: Iterable[tuple[Hashable, GenRequest]], on_done: OnDone, *, seed: int | None = None
    ) -> None:
        """Generate keyed requests with continuous batching; ``on_done(key, result)`` as
        each finishes, whose returned follow-ups join the running batch (module docstring).

        Results are those of :meth:`generate` for the same requests (greedy tokens equal,
        log-probs up to float rounding: a row's batch companions change, its inputs do not).
        Requests over ``max_context`` or with ``max_new_tokens=0`` finish at once, as in
        :meth:`generate`. Callbacks run between decode steps, in the order rows finish.
        """
        pol = self.policy
        gen = None
        if seed is not None:
            gen = torch.Generator(device=pol.device)
            gen.manual_seed(seed)
        lanes = [_Lane(b) for b in pol.loaded_bases]
        lane_of = {id(lane.b): lane for lane in lanes}
        done: deque[tuple[Any, GenResult]] = deque()

        def submit(items: Iterable[tuple[Hashable, GenRequest]] | None) -> None:
            for key, req in items or ():
                check_stream_request(key, req)
                if len(req.prompt_ids) == 0:
                    raise ValueError(f"empty prompt for role {req.role!r}")
                b = pol.loaded_base(req.role)
                s = req.sampling
                if len(req.prompt_ids) + s.max_new_tokens > b.max_context:
                    pol.stats["context_overflow"] += 1
                    done.append((key, GenResult([], "", [], "context")))
                elif s.max_new_tokens == 0:
                    done.append((key, GenResult([], "", [], "length")))
                else:
                    lane_of[id(b)].queue.append(_Row(key, req, pol.adapter_of(req.role)))

        with torch.no_grad(), contextlib.ExitStack() as stack:
            for lane in lanes:
                stack.enter_context(train_mode(lane.b.model, False))
                stack.enter_context(_decode_head(lane.b.backbone_owner))
            stack.enter_context(pol.autocast())
            submit(requests)
            while True:
                while done:
                    submit(on_done(*done.popleft()))
                if not any(lane.rows or lane.queue for lane in lanes):
                    return
                for lane in lanes:
                    if lane.rows:
                        self._advance_lane(lane)
                    if lane.queue and self._may_join(lane):
                        self._join_lane(lane)
                for lane in lanes:
                    if lane.rows:
                        done.extend(self._sample_lane(lane, gen))

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
            "continuous_batching": self.continuous_batching,
            "join_fraction": self.join_fraction,
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

    # ---- continuous batching (generate_stream) -------------------------------------------
    def _sample_lane(self, lane: _Lane, gen: torch.Generator | None) -> list[tuple[Any, GenResult]]:
        """Sample the next token of every row of ``lane``; finished rows leave the batch."""
        pol, b = self.policy, lane.b
        tok = b.tokenizer
        tokens, lps = sample_next(lane.logits, lane.temp, lane.top_p, lane.greedy, gen)
        lane.logits, lane.tokens = None, tokens
        tl, ll = tokens.tolist(), lps.tolist()
        keep: list[int] = []
        finished: list[tuple[Any, GenResult]] = []
        for i, row in enumerate(lane.rows):
            t = tl[i]
            row.ids.append(t)
            row.lps.append(ll[i])
            s = row.req.sampling
            if t in b.eos_ids:
                reason = "eos"
            elif s.stop and _hit_stop(tok, row.ids, s.stop):
                reason = "stop"
            elif len(row.ids) >= s.max_new_tokens:
                reason = "length"
            else:
                keep.append(i)
                continue
            finished.append((row.key, GenResult(row.ids, tok.decode(row.ids, skip_special_tokens=True), row.lps, reason)))
        pol.stats["generated_tokens"] += len(lane.rows)
        pol.stats["requests"] += len(finished)
        if len(keep) != len(lane.rows):
            lane.select(keep)
        return finished

    def _may_join(self, lane: _Lane) -> bool:
        """Do ``lane``'s queued requests join now (see ``join_fraction``)?"""
        if not lane.rows:
            return True
        if len(lane.rows) >= self.policy.max_batch or not _mergeable(lane.cache):
            return False
        return len(lane.queue) >= max(1.0, self.join_fraction * len(lane.rows))

    def _advance_lane(self, lane: _Lane) -> None:
        """Feed each row's sampled token: one forward of the running batch."""
        lane.mask = torch.cat([lane.mask, lane.mask.new_ones((len(lane.rows), 1))], dim=1)
        out = self._forward(
            lane.b, ids=lane.tokens[:, None], mask=lane.mask, position=lane.next_pos[:, None], cache=lane.cache,
            adapters=[row.adapter for row in lane.rows], keep=1,
        )
        lane.logits, lane.tokens = out.logits[:, -1], None
        lane.next_pos = lane.next_pos + 1

    def _join_lane(self, lane: _Lane) -> None:
        """Prefill queued requests (up to ``max_batch`` rows in all) and merge them into the batch."""
        pol, b = self.policy, lane.b
        dev = pol.device
        tok = b.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        new = [lane.queue.popleft() for _ in range(min(len(lane.queue), pol.max_batch - len(lane.rows)))]
        keys: dict[tuple[str | None, tuple[int, ...]], int] = {}
        src = [keys.setdefault((row.adapter, tuple(row.req.prompt_ids)), len(keys)) for row in new]
        pol.stats["prefill_shared"] += len(new) - len(keys)

        cache = DynamicCache()
        run = functools.partial(self._forward, b, cache=cache)
        logits, mask = self._prefill(run, cache, [list(p) for _, p in keys], [a for a, _ in keys], pad)
        if len(keys) != len(new):
            rows = torch.tensor(src, dtype=torch.long, device=dev)
            cache.batch_select_indices(rows)
            logits, mask = logits[rows], mask[rows]
        temp = torch.tensor([r.req.sampling.temperature for r in new], dtype=torch.float32, device=dev)
        top_p = torch.tensor([r.req.sampling.top_p for r in new], dtype=torch.float32, device=dev)
        greedy = torch.tensor([r.req.sampling.is_greedy for r in new], dtype=torch.bool, device=dev)
        if not lane.rows:
            lane.cache, lane.mask, lane.logits = cache, mask, logits
            lane.next_pos, lane.temp, lane.top_p, lane.greedy = mask.sum(-1), temp, top_p, greedy
            lane.rows = new
            return
        width = max(lane.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(lane.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width, 2), _pad_left(theirs.keys, width, 2)], 0)
            mine.values = torch.cat([_pad_left(mine.values, width, 2), _pad_left(theirs.values, width, 2)], 0)
        lane.mask = torch.cat([_pad_left(lane.mask, width, 1), _pad_left(mask, width, 1)], 0)
        lane.logits = torch.cat([lane.logits, logits], 0)
        lane.next_pos = torch.cat([lane.next_pos, mask.sum(-1)], 0)
        lane.temp, lane.top_p = torch.cat([lane.temp, temp]), torch.cat([lane.top_p, top_p])
        lane.greedy = torch.cat([lane.greedy, greedy])
        lane.rows = lane.rows + new

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
        kwargs: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=keep)
        kwargs[cache_kwarg(b.model)] = cache  # `past_key_values` warns on transformers 5.x
        if self.policy.mode == "full":
            return b.model(**kwargs)
        distinct = set(adapters)
        if len(distinct) == 1:
            (only,) = distinct
            with self.policy.use_adapter(b, only):
                return b.model(**kwargs)
        names = [a if a is not None else "__base__" for a in adapters]
        return b.model(**kwargs, adapter_names=names)
