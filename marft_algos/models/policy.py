"""TeamPolicy: every role of an LLM team on ONE shared base model, in one process.

Modes:
    ``"lora"`` (default): one peft LoRA adapter per role (roles may share an adapter by
        naming it, e.g. the profile field ``adapter``), all on one base model object.
        Memory is one base plus n small adapters.
    ``"shared"``: one adapter for all roles (parameter sharing).
    ``"full"``: full fine-tuning. With several roles this means ONE shared trainable model
        (one copy of the weights per role would defeat the purpose of a shared base); the
        LoRA-style reference policy is replaced by a frozen copy of the initial weights
        (``full_reference=True``).
    Heterogeneous teams: ``base={role: model_name}``; each distinct base is loaded once and
    carries the adapters of its roles.

Generation is a hand-written KV-cached decode loop over a left-padded batch that mixes
roles/adapters in one forward per step (peft ``adapter_names``, one name per row), with
per-row temperature, top-p, max-new-tokens and stop strings; rows finish independently
and finished rows are dropped from the batch (and its KV cache). Identical prompts of one
adapter (GRPO groups, ``GenRequest.n``) are prefilled once and the cache is expanded.

Adapter activation and ``requires_grad`` are managed here directly (not through peft's
``set_adapter``/``disable_adapter``, which also rewrite ``requires_grad`` flags): every
adapter stays trainable unless :meth:`TeamPolicy.set_train_role` narrows it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marft_algos.models.loading import load_base, parse_dtype
from marft_algos.models.prefix import PrefixPlan, left_pad, plan_prefixes
from marft_algos.models.sampling import GenRequest, GenResult, TokenStats, sample_next

__all__ = ["LoraSettings", "TeamPolicy"]

_FORMAT = 1


@dataclass
class LoraSettings:
    """LoRA hyper-parameters (peft ``LoraConfig`` subset)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def to_peft(self) -> Any:
        """The equivalent peft ``LoraConfig``."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )


@dataclass
class _Base:
    """One loaded base model and the roles that run on it."""

    slot: int
    name: str
    model: nn.Module  # a PeftModel in lora/shared mode, the plain model in full mode
    tokenizer: Any
    roles: list[str]
    max_context: int
    eos_ids: frozenset[int]
    reference: nn.Module | None = None  # frozen initial copy (full mode)
    tuner_layers: list[Any] = field(default_factory=list)
    adapter_params: dict[str, list[nn.Parameter]] = field(default_factory=dict)
    ckpt_layers: list[nn.Module] = field(default_factory=list)  # armed for activation checkpointing

    @property
    def backbone_owner(self) -> nn.Module:
        """The underlying ``*ForCausalLM`` (inside the peft wrapper, if any)."""
        get = getattr(self.model, "get_base_model", None)
        return get() if callable(get) else self.model


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


def _sanitize(name: str) -> str:
    """peft adapter names become ModuleDict keys: no dots, not empty."""
    clean = re.sub(r"[^0-9A-Za-z_\-]", "_", name) or "adapter"
    if clean in "lora_" or clean in ("__base__", "default"):  # peft reserves these / matches by substring
        clean = f"role_{clean}"
    return clean


def _eos_ids(model: nn.Module, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return frozenset(ids)


def _tuner_state(tuners: Sequence[Any]) -> list[tuple[Any, bool]]:
    """Which adapters each peft tuner layer runs: ``(active adapters, disabled)`` per layer."""
    return [(t._active_adapter, t._disable_adapters) for t in tuners]


def _set_tuner_state(tuners: Sequence[Any], state: Sequence[tuple[Any, bool]]) -> None:
    for t, (active, disabled) in zip(tuners, state, strict=True):
        t._active_adapter, t._disable_adapters = active, disabled


def _checkpoint_with_adapters(tuners: Sequence[Any], fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Checkpoint one decoder layer (non-reentrant) whose recomputation, run later in the
    backward pass, re-activates the adapters its forward ran with (``tuners``: the layer's
    peft tuner layers)."""
    from torch.utils.checkpoint import checkpoint

    state = _tuner_state(tuners)

    def replay(*a: Any, **k: Any) -> Any:
        now = _tuner_state(tuners)
        _set_tuner_state(tuners, state)
        try:
            return fn(*a, **k)
        finally:
            _set_tuner_state(tuners, now)

    return checkpoint(replay, *args, use_reentrant=False, **kwargs)


class TeamPolicy:
    """The team's policies: per-role adapters on shared base model(s).

    Args:
        roles: role names (agent ids).
        base: a model alias/path/Hub id for all roles, a ``(model, tokenizer)`` pair, or a
            mapping ``{role: name_or_pair}`` for a heterogeneous team.
        mode: ``"lora"``, ``"shared"`` or ``"full"`` (see the module docstring).
        lora: LoRA settings (lora/shared modes).
        adapters: ``{role: adapter_name}``; roles naming the same adapter share it.
        device: default CUDA when available, else CPU.
        dtype: compute dtype. ``None`` = fp32 on CPU, bf16 autocast on CUDA; ``"bf16"`` /
            ``"fp16"`` autocast on any device. Parameters always stay fp32 (master
            weights); only the forward runs in ``dtype`` (trainers add loss scaling for fp16).
        max_context: prompt + response token limit (default: the model's
            ``max_position_embeddings``).
        seed: seeds the adapters' initialisation (deterministic given the seed).
        cache_dir: converted-model cache root (see :func:`load_base`).
        full_reference: in full mode keep a frozen copy of the initial weights for
            ``reference=True`` log-probs.
        max_batch: most rows decoded together.
        merge_for_decode: decode a batch whose rows all use one LoRA adapter with that
            adapter folded into the base weights (faster on CPU; the weights are restored
            exactly afterwards); rows of several adapters use peft's mixed batch.
        share_prefixes: run a prompt prefix shared by several rows (a GRPO group, an
            agent's system prompt and problem) once, in prefills and in training
            log-probs (:mod:`marft_algos.models.prefix`); the results are the same up to
            float rounding.
        activation_checkpointing: in training forwards (with grad) keep only each decoder
            layer's input and recompute the layer in the backward pass, so the memory of
            a training step no longer grows with tokens x layers (the price: one more
            forward of the layers, and no prefix sharing in training forwards, since a
            recomputed layer must not write a shared cache twice). Needs a transformers
            model whose decoder layers support gradient checkpointing.
    """

    def __init__(
        self,
        roles: Sequence[str],
        base: str | tuple[Any, Any] | Mapping[str, Any] = "smollm2-135m",
        mode: str = "lora",
        lora: LoraSettings | None = None,
        *,
        adapters: Mapping[str, str] | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_context: int | None = None,
        seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        full_reference: bool = True,
        max_batch: int = 64,
        merge_for_decode: bool = True,
        share_prefixes: bool = True,
        activation_checkpointing: bool = False,
    ) -> None:
        if mode not in ("lora", "shared", "full"):
            raise ValueError(f"mode must be 'lora', 'shared' or 'full', got {mode!r}")
        roles = list(roles)
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"roles must be a non-empty list of distinct names, got {roles}")
        if isinstance(base, Mapping):
            unknown = set(base) - set(roles)
            if unknown:
                raise ValueError(f"base mapping names unknown roles {sorted(unknown)}")
        self.roles = roles
        self.mode = mode
        self.lora = lora or LoraSettings()
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        compute = parse_dtype(dtype)
        if compute is None:
            compute = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.compute_dtype = compute
        self.max_batch = int(max_batch)
        self.merge_for_decode = bool(merge_for_decode)
        self.share_prefixes = bool(share_prefixes)
        self.activation_checkpointing = bool(activation_checkpointing)
        self.seed = seed
        self.stats: Counter[str] = Counter()
        self._train_role: str | None = None

        # ---- load each distinct base once ------------------------------------------------
        spec_of = {r: (base.get(r, "smollm2-135m") if isinstance(base, Mapping) else base) for r in roles}
        self._bases: list[_Base] = []
        self._base_of: dict[str, _Base] = {}
        by_key: dict[Any, _Base] = {}
        for role in roles:
            spec = spec_of[role]
            key = (id(spec[0]) if isinstance(spec, tuple) else str(spec))
            if key not in by_key:
                if isinstance(spec, tuple):
                    model, tokenizer = spec
                    name = getattr(getattr(model, "config", None), "_name_or_path", "") or "<model object>"
                    model.to(self.device, dtype=torch.float32)
                else:
                    model, tokenizer = load_base(spec, device=self.device, cache_dir=cache_dir)
                    name = str(spec)
                tokenizer.padding_side = "left"
                if tokenizer.pad_token_id is None:
                    tokenizer.pad_token = tokenizer.eos_token
                limit = int(max_context or getattr(model.config, "max_position_embeddings", 2048) or 2048)
                entry = _Base(len(self._bases), name, model, tokenizer, [], limit, _eos_ids(model, tokenizer))
                by_key[key] = entry
                self._bases.append(entry)
            by_key[key].roles.append(role)
            self._base_of[role] = by_key[key]

        # ---- adapters ------------------------------------------------------------------
        self._adapter_of: dict[str, str | None] = {}
        for role in roles:
            if mode == "full":
                self._adapter_of[role] = None
            elif mode == "shared":
                self._adapter_of[role] = "shared"
            else:
                self._adapter_of[role] = _sanitize((adapters or {}).get(role, role))
        for b in self._bases:
            if mode == "full":
                self._setup_full(b, full_reference)
            else:
                names = list(dict.fromkeys(self._adapter_of[r] for r in b.roles))
                self._setup_lora(b, names)
            b.ckpt_layers = self._checkpoint_layers(b) if self.activation_checkpointing else []

    # ------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------
    def _setup_lora(self, b: _Base, names: list[str]) -> None:
        from peft import get_peft_model

        cfg = self.lora.to_peft()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            peft_model = get_peft_model(b.model, copy.deepcopy(cfg), adapter_name=names[0])
            for name in names[1:]:
                peft_model.add_adapter(name, copy.deepcopy(cfg))
        peft_model.eval()
        b.model = peft_model
        self._index_adapters(b)
        for params in b.adapter_params.values():
            for p in params:
                p.requires_grad_(True)

    @staticmethod
    def _checkpoint_layers(b: _Base) -> list[nn.Module]:
        """Arm transformers' per-layer checkpointing (non-reentrant) on ``b``'s decoder layers.

        The layers checkpoint only while their own ``training`` flag is set, which
        :meth:`_checkpointing` does for training forwards alone (non-recursively: dropout
        modules stay in eval mode, so the recomputation is the same function). The
        backward pass recomputes a layer after :meth:`_adapter` has restored the adapter
        selection, so each layer's recomputation re-activates the adapters that were
        active in its forward.
        """
        from peft.tuners.tuners_utils import BaseTunerLayer
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in b.model.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise ValueError(
                f"activation_checkpointing=True, but the decoder layers of {b.name!r} do not support gradient "
                "checkpointing (no transformers GradientCheckpointingLayer); set activation_checkpointing=False"
            )
        for layer in layers:
            tuners = [m for m in layer.modules() if isinstance(m, BaseTunerLayer)]
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = functools.partial(_checkpoint_with_adapters, tuners)
        return layers

    @contextlib.contextmanager
    def _checkpointing(self, b: _Base) -> Iterator[None]:
        """Checkpoint ``b``'s decoder layers inside this block (a no-op when not armed)."""
        was = [layer.training for layer in b.ckpt_layers]
        for layer in b.ckpt_layers:
            layer.training = True
        try:
            yield
        finally:
            for layer, w in zip(b.ckpt_layers, was, strict=True):
                layer.training = w

    def _index_adapters(self, b: _Base) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        b.tuner_layers = [m for m in b.model.modules() if isinstance(m, BaseTunerLayer)]
        params: dict[str, list[nn.Parameter]] = {}
        for layer in b.tuner_layers:
            for attr in layer.adapter_layer_names:
                holder = getattr(layer, attr)
                for adapter, sub in holder.items():
                    if isinstance(sub, nn.Parameter):
                        params.setdefault(adapter, []).append(sub)
                    else:
                        params.setdefault(adapter, []).extend(sub.parameters())
        b.adapter_params = params

    def _setup_full(self, b: _Base, keep_reference: bool) -> None:
        if keep_reference:
            b.reference = copy.deepcopy(b.model).eval()
            for p in b.reference.parameters():
                p.requires_grad_(False)
        for p in b.model.parameters():
            p.requires_grad_(True)

    def add_adapter(self, role_or_slot: str | int, name: str, lora: LoraSettings | None = None) -> list[nn.Parameter]:
        """Add an extra adapter (e.g. the critic's) to a base; returns its (trainable) params.

        Used by :class:`ValueModel`; policy adapters' ``requires_grad`` flags are preserved.
        """
        if self.mode == "full":
            raise ValueError("mode='full' has no peft wrapper to add an adapter to")
        b = self._bases[role_or_slot] if isinstance(role_or_slot, int) else self._base_of[role_or_slot]
        name = _sanitize(name)
        if name not in b.adapter_params:
            flags = {id(p): p.requires_grad for ps in b.adapter_params.values() for p in ps}
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + 1)
                b.model.add_adapter(name, (lora or self.lora).to_peft())
            self._index_adapters(b)
            for ps in b.adapter_params.values():
                for p in ps:
                    p.requires_grad_(flags.get(id(p), True))
        return b.adapter_params[name]

    # ------------------------------------------------------------------------------------
    # lookups
    # ------------------------------------------------------------------------------------
    def _base(self, role: str) -> _Base:
        try:
            return self._base_of[role]
        except KeyError:
            raise KeyError(f"unknown role {role!r}; roles: {self.roles}") from None

    def adapter_of(self, role: str) -> str | None:
        """The adapter name a role uses (None in full mode)."""
        self._base(role)
        return self._adapter_of[role]

    def model(self, role: str) -> nn.Module:
        """The (peft-wrapped) model object that runs ``role``."""
        return self._base(role).model

    def base_model(self, role: str) -> nn.Module:
        """The plain ``*ForCausalLM`` under the adapters of ``role`` (shared, not a copy)."""
        return self._base(role).backbone_owner

    def tokenizer(self, role: str) -> Any:
        """The tokenizer of ``role``'s base."""
        return self._base(role).tokenizer

    def max_context(self, role: str) -> int:
        """The prompt + response token limit of ``role``'s base."""
        return self._base(role).max_context

    @property
    def bases(self) -> list[str]:
        """Names of the distinct loaded bases."""
        return [b.name for b in self._bases]

    # ------------------------------------------------------------------------------------
    # prompts
    # ------------------------------------------------------------------------------------
    def encode(self, role: str, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of ``messages`` through the tokenizer's chat template + generation prompt.

        Message contents stay literal text (:func:`marft_algos.models.chat.encode_chat`):
        a teammate's ``<|im_start|>system`` is never a real turn marker."""
        from marft_algos.models.chat import encode_chat

        tok = self._base(role).tokenizer
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"the tokenizer of role {role!r} has no chat template")
        return encode_chat(tok, messages, add_generation_prompt=True)

    # ------------------------------------------------------------------------------------
    # forward helpers
    # ------------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        # Any device: an explicit dtype='bf16'/'fp16' on CPU runs reduced precision too
        # (slow there; it is how the fp16 loss-scaling path is tested without a GPU).
        if self.compute_dtype in (torch.bfloat16, torch.float16):
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _adapter(self, b: _Base, adapter: str | None, *, disabled: bool = False) -> Iterator[None]:
        """Activate one adapter (or none) for plain forwards; restores the previous state."""
        saved = _tuner_state(b.tuner_layers)
        try:
            for layer in b.tuner_layers:
                if disabled or adapter is None:
                    layer._disable_adapters = True
                else:
                    layer._active_adapter = [adapter]
                    layer._disable_adapters = False
            yield
        finally:
            _set_tuner_state(b.tuner_layers, saved)

    @contextlib.contextmanager
    def _merged(self, b: _Base, adapter: str) -> Iterator[bool]:
        """Fold ``adapter`` into the base weights for a no-grad decode; yields whether it did.

        A decode step of a 135M model on a CPU spends ~15% of its time in the LoRA side
        paths (two small matmuls and peft's dispatch per adapted linear). With one adapter
        for the whole batch, ``W + scale * B @ A`` is computed once per decode round and the
        adapters are switched off; the original weight tensors are put back afterwards
        (exactly: the same tensor objects, no subtract-to-unmerge rounding).
        """
        from peft.tuners.lora import Linear as LoraLinear

        layers = [layer for layer in b.tuner_layers if adapter in getattr(layer, "lora_A", {})]
        plain = all(
            type(layer) is LoraLinear and not layer.use_dora.get(adapter, False) and not layer.merged for layer in layers
        )
        if not layers or not plain:
            yield False
            return
        saved: list[tuple[nn.Parameter, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for layer in layers:
                    w = layer.get_base_layer().weight
                    saved.append((w, w.data))
                    w.data = w.data + layer.get_delta_weight(adapter).to(w.dtype)
            with self._adapter(b, None, disabled=True):
                yield True
        finally:
            for w, data in saved:
                w.data = data

    @contextlib.contextmanager
    def _mode(self, module: nn.Module, train: bool) -> Iterator[None]:
        was = module.training
        module.train(train)
        try:
            yield
        finally:
            module.train(was)

    # ------------------------------------------------------------------------------------
    # generation
    # ------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> list[GenResult]:
        """Generate one result per request (``n`` results for a request with ``n > 1``,
        consecutively), batching all roles that share a base into one decode loop.

        Identical prompts of the same adapter are prefilled once. A request whose
        ``len(prompt) + max_new_tokens`` exceeds ``max_context`` gets
        ``finish_reason="context"`` and an empty action (counted in
        ``stats["context_overflow"]``); prompts are never truncated.
        """
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        slots: list[tuple[int, GenRequest]] = []  # (output position, request with n=1)
        pos = 0
        for req in requests:
            for _ in range(max(1, int(req.n))):
                slots.append((pos, req))
                pos += 1
        results: list[GenResult | None] = [None] * pos
        for b in self._bases:
            mine = [(p, r) for p, r in slots if self._base(r.role) is b]
            todo = []
            for p, r in mine:
                s = r.sampling
                if len(r.prompt_ids) == 0:
                    raise ValueError(f"empty prompt for role {r.role!r}")
                if len(r.prompt_ids) + s.max_new_tokens > b.max_context:
                    self.stats["context_overflow"] += 1
                    results[p] = GenResult([], "", [], "context")
                elif s.max_new_tokens == 0:
                    results[p] = GenResult([], "", [], "length")
                else:
                    todo.append((p, r))
            # keep identical prompts adjacent so a chunk prefills them once
            todo.sort(key=lambda pr: (self._adapter_of[pr[1].role] or "", tuple(pr[1].prompt_ids)))
            for start in range(0, len(todo), self.max_batch):
                chunk = todo[start : start + self.max_batch]
                for (p, _), res in zip(chunk, self._decode(b, [r for _, r in chunk], gen), strict=True):
                    results[p] = res
        return [r for r in results if r is not None]

    def generate_groups(self, request: GenRequest, n: int, *, seed: int | None = None) -> list[GenResult]:
        """``n`` samples of one prompt (a GRPO group): one prefill, KV cache expanded to n rows."""
        return self.generate([GenRequest(request.role, list(request.prompt_ids), request.sampling, n=n)], seed=seed)

    @torch.no_grad()
    def _decode(self, b: _Base, reqs: list[GenRequest], gen: torch.Generator | None) -> list[GenResult]:
        dev = self.device
        tok = b.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        # ---- unique prompts (per adapter) --------------------------------------------------
        keys: dict[tuple[str | None, tuple[int, ...]], int] = {}
        src = []
        for r in reqs:
            k = (self._adapter_of[r.role], tuple(r.prompt_ids))
            src.append(keys.setdefault(k, len(keys)))
        uniq = list(keys)
        self.stats["prefill_shared"] += len(reqs) - len(uniq)
        from transformers import DynamicCache

        cache = DynamicCache()
        model = b.model
        distinct = {self._adapter_of[r.role] for r in reqs}
        only = next(iter(distinct)) if len(distinct) == 1 else None
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._mode(model, False))
            stack.enter_context(self._autocast())
            stack.enter_context(_decode_head(b.backbone_owner))
            merged = only is not None and self.merge_for_decode and stack.enter_context(self._merged(b, only))
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
            adapters = [None if merged else self._adapter_of[r.role] for r in reqs]
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
                    elif s.stop and self._hit_stop(tok, out_ids[ri], s.stop):
                        finish[ri] = "stop"
                    elif len(out_ids[ri]) >= s.max_new_tokens:
                        finish[ri] = "length"
                    else:
                        keep.append(row)
                self.stats["generated_tokens"] += len(live)
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
        self.stats["requests"] += len(reqs)
        return [
            GenResult(out_ids[i], tok.decode(out_ids[i], skip_special_tokens=True), out_lp[i], finish[i])
            for i in range(len(reqs))
        ]

    def _two_stage(
        self,
        run: Callable[..., Any],
        cache: Any,
        prompts: Sequence[Sequence[int]],
        plan: PrefixPlan,
        cluster_adapters: list[str | None],
        row_adapters: list[str | None],
        pad: int,
        tail_ids: torch.Tensor | None = None,
        tail_mask: torch.Tensor | None = None,
        keep: int = 1,
    ) -> tuple[Any, torch.Tensor]:
        """Prefixes once per cluster, then each row's suffix (+ ``tail``) on their cache.

        ``run(ids=, mask=, position=, adapters=, keep=)`` is one forward that extends
        ``cache``. Returns the second forward's output and the attention mask of the
        whole row (prefix, suffix, tail) for a continued decode.
        """
        dev = self.device
        pid, pmask = plan.prefix_batch(prompts, pad)
        pid, pmask = pid.to(dev), pmask.to(dev)
        run(ids=pid, mask=pmask, position=(pmask.cumsum(-1) - 1).clamp_min(0), adapters=cluster_adapters, keep=1)
        rows = torch.tensor(plan.cluster_of, dtype=torch.long, device=dev)
        cache.batch_select_indices(rows)
        sid, smask = plan.suffix_batch(prompts, pad)
        cur, cur_mask = sid.to(dev), smask.to(dev)
        if tail_ids is not None and tail_mask is not None:
            cur, cur_mask = torch.cat([cur, tail_ids], 1), torch.cat([cur_mask, tail_mask], 1)
        full = torch.cat([pmask[rows], cur_mask], 1)
        position = (full.cumsum(-1) - 1).clamp_min(0)[:, pid.shape[1] :]
        out = run(ids=cur, mask=full, position=position, adapters=row_adapters, keep=keep)
        return out, full

    def _prefill(
        self, run: Callable[..., Any], cache: Any, prompts: list[list[int]], adapters: list[str | None], pad: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``prompts`` into ``cache``; ``(last-position logits [U, V], mask [U, W])``.

        Prompts of one adapter that share a long prefix (an agent's system prompt and the
        problem before its teammates' actions) run it once (:func:`plan_prefixes`).
        """
        plan = plan_prefixes(prompts, adapters) if self.share_prefixes else None
        if plan is not None:
            cluster_adapters = [adapters[r] for r in plan.first_row]
            out, mask = self._two_stage(run, cache, prompts, plan, cluster_adapters, adapters, pad)
            self.stats["prefill_tokens"] += plan.tokens(prompts)
            self.stats["prefill_prefix_saved"] += sum(len(p) for p in prompts) - plan.tokens(prompts)
            return out.logits[:, -1], mask
        ids, mask = left_pad(prompts, pad)
        ids, mask = ids.to(self.device), mask.to(self.device)
        self.stats["prefill_tokens"] += int(mask.sum())
        out = run(ids=ids, mask=mask, position=(mask.cumsum(-1) - 1).clamp_min(0), adapters=adapters, keep=1)
        return out.logits[:, -1], mask

    def _forward(
        self,
        b: _Base,
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
        if self.mode == "full":
            return b.model(**kwargs)
        distinct = set(adapters)
        if len(distinct) == 1:
            (only,) = distinct
            with self._adapter(b, only):
                return b.model(**kwargs)
        names = [a if a is not None else "__base__" for a in adapters]
        return b.model(**kwargs, adapter_names=names)

    @staticmethod
    def _hit_stop(tok: Any, ids: list[int], stops: list[str]) -> bool:
        """Does the decoded tail of ``ids`` contain a stop string?

        Checked after every token, so the first hit is completed by the last token. The
        tail is long enough for any stop string (a character is at most 4 byte tokens).
        """
        longest = max(len(s) for s in stops)
        tail = tok.decode(ids[-(4 * longest + 4) :], skip_special_tokens=True)
        return any(s in tail for s in stops)

    # ------------------------------------------------------------------------------------
    # training-time log-probs
    # ------------------------------------------------------------------------------------
    def _layout(
        self, b: _Base, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
        """Left-padded prompts followed by right-padded responses (same layout as decoding).

        Returns ``(ids, attention_mask, position_ids, response [B,R], response_mask [B,R], P, R)``
        where ``ids`` is the full ``[B, P+R]`` row; response token j of a row sits at column
        ``P + j`` and is predicted from column ``P + j - 1``.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        pad = b.tokenizer.pad_token_id if b.tokenizer.pad_token_id is not None else 0
        n = len(prompt_ids)
        plen = max(len(p) for p in prompt_ids)
        rlen = max((len(r) for r in response_ids), default=0)
        ids = torch.full((n, plen + rlen), pad, dtype=torch.long)
        att = torch.zeros((n, plen + rlen), dtype=torch.long)
        resp = torch.zeros((n, rlen), dtype=torch.long)
        rmask = torch.zeros((n, rlen), dtype=torch.float32)
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
            ids[i, plen - len(p) : plen] = torch.as_tensor(list(p), dtype=torch.long)
            att[i, plen - len(p) : plen + len(r)] = 1
            if len(r):
                ids[i, plen : plen + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
                resp[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
                rmask[i, : len(r)] = 1.0  # from lengths: EOS == pad stays in the mask
        pos = (att.cumsum(-1) - 1).clamp_min(0)
        dev = self.device
        return ids.to(dev), att.to(dev), pos.to(dev), resp.to(dev), rmask.to(dev), plen, rlen

    def sequence_logprobs(
        self,
        role: str,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        reference: bool = False,
        dropout: bool = False,
    ) -> TokenStats:
        """Log-probs and entropies of ``response_ids`` given ``prompt_ids`` under ``role``.

        A batched forward on exactly ``prompt + response`` (prompts left-padded,
        responses right-padded), with grad unless called under ``torch.no_grad()``. A
        prompt prefix shared by several rows (a GRPO group; an agent's system prompt and
        problem) runs once and the rows continue from its cache (``share_prefixes``):
        the same tokens in the same context, fewer of them to run and backpropagate.
        ``reference=True`` evaluates the reference policy: the base with adapters disabled
        (lora/shared) or the frozen initial copy (full), always without grad.

        Dropout (LoRA dropout, and any dropout of the base model) is off unless
        ``dropout=True``: the sampler runs without it, so a PPO ratio between these
        log-probs and the sampled ones compares the same deterministic function (a forward
        with dropout would put mask noise into every ratio and KL).

        Returns:
            :class:`TokenStats` with ``[B, T]`` tensors, ``T`` = longest response; the
            distribution is ``softmax(logits / temperature)`` (matches sampling).
        """
        b = self._base(role)
        ids, att, pos, resp, rmask, plen, rlen = self._layout(b, prompt_ids, response_ids)
        n = ids.shape[0]
        if rlen == 0:
            z = torch.zeros((n, 0), device=self.device)
            return TokenStats(z, z.clone(), z.clone())
        stack = contextlib.ExitStack()
        if reference:
            stack.enter_context(torch.no_grad())
            stack.enter_context(self._autocast())
            if self.mode == "full":
                if b.reference is None:
                    raise ValueError("reference=True in mode='full' needs full_reference=True")
                model = b.reference
            else:
                model = b.model
                stack.enter_context(self._adapter(b, None, disabled=True))
                stack.enter_context(self._mode(b.model, False))
        else:
            model = b.model
            stack.enter_context(self._autocast())
            stack.enter_context(self._mode(b.model, dropout))
            if self.mode != "full":
                stack.enter_context(self._adapter(b, self._adapter_of[role]))
        # (with dropout on, a recomputed layer would draw new masks: no checkpointing)
        checkpointed = bool(b.ckpt_layers) and not reference and not dropout and torch.is_grad_enabled()
        if checkpointed:
            stack.enter_context(self._checkpointing(b))
        plan = plan_prefixes(prompt_ids) if self.share_prefixes and not checkpointed else None
        with stack:
            if plan is None:
                kwargs = dict(input_ids=ids[:, :-1], attention_mask=att[:, :-1], position_ids=pos[:, :-1], use_cache=False, logits_to_keep=rlen)
                logits = model(**kwargs).logits
            else:
                from transformers import DynamicCache

                cache = DynamicCache()

                def run(*, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, adapters: Any, keep: int) -> Any:
                    return model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True, logits_to_keep=keep)

                pad = b.tokenizer.pad_token_id if b.tokenizer.pad_token_id is not None else 0
                # response tokens follow the left-padded suffixes; the last input column is
                # dropped (nothing to predict after it), as in the one-stage layout
                tail_ids, tail_mask = resp[:, :-1], (rmask[:, :-1] > 0).long()
                out, _ = self._two_stage(run, cache, prompt_ids, plan, [None] * plan.num_clusters, [None] * n, pad, tail_ids, tail_mask, keep=rlen)
                logits = out.logits
                self.stats["train_prefix_saved"] += sum(len(p) for p in prompt_ids) - plan.tokens(prompt_ids)
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        logp = logp_all.gather(-1, resp[..., None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return TokenStats(logp * rmask, entropy * rmask, rmask)

    # ------------------------------------------------------------------------------------
    # parameters
    # ------------------------------------------------------------------------------------
    def trainable_parameters(self, role: str) -> list[nn.Parameter]:
        """The parameters ``role`` trains: its adapter's (shared by roles naming the same
        adapter), or the whole shared model in full mode. Returned regardless of the
        current ``requires_grad`` flags."""
        b = self._base(role)
        if self.mode == "full":
            return list(b.model.parameters())
        return list(b.adapter_params[self._adapter_of[role]])

    def set_train_role(self, role: str | None) -> None:
        """Only ``role``'s adapter requires grad (agent-by-agent updates); ``None`` = all."""
        if role is not None:
            self._base(role)
        self._train_role = role
        if self.mode == "full":
            return
        train_key = (self._base(role).slot, self._adapter_of[role]) if role is not None else None
        policy_adapters = {(self._base(r).slot, self._adapter_of[r]) for r in self.roles}
        for b in self._bases:
            for name, params in b.adapter_params.items():
                if (b.slot, name) not in policy_adapters:
                    continue  # extra adapters (critic) are managed by their owner
                flag = train_key is None or train_key == (b.slot, name)
                for p in params:
                    p.requires_grad_(flag)

    def adapter_state_dict(self, role: str) -> dict[str, torch.Tensor]:
        """A CPU copy of ``role``'s trainable weights (peft key format in lora/shared)."""
        b = self._base(role)
        if self.mode == "full":
            return {k: v.detach().cpu().clone() for k, v in b.model.state_dict().items()}
        from peft.utils import get_peft_model_state_dict

        sd = get_peft_model_state_dict(b.model, adapter_name=self._adapter_of[role])
        return {k: v.detach().cpu().clone() for k, v in sd.items()}

    adapter_state = adapter_state_dict  # contract name

    def load_adapter_state_dict(self, role: str, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights into ``role``'s adapter in place; the params stay trainable."""
        b = self._base(role)
        if self.mode == "full":
            b.model.load_state_dict(dict(state))
            return
        from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

        name = self._adapter_of[role]
        # Compare key sets up front: an adapter equal to its fresh initialisation (a run
        # that has not moved yet) is a valid state, so "did any weight change" is no test.
        expected = set(get_peft_model_state_dict(b.model, adapter_name=name))
        got = set(state)
        if got != expected:
            raise ValueError(
                f"adapter state for role {role!r} does not match its adapter: "
                f"missing {sorted(expected - got)[:3]}, unexpected {sorted(got - expected)[:3]}"
            )
        flags = [p.requires_grad for p in b.adapter_params[name]]
        set_peft_model_state_dict(b.model, dict(state), adapter_name=name)
        for p, f in zip(b.adapter_params[name], flags, strict=True):
            p.requires_grad_(f)

    # ------------------------------------------------------------------------------------
    # persistence
    # ------------------------------------------------------------------------------------
    def _adapter_dirname(self, b: _Base, name: str) -> str:
        return name if len(self._bases) == 1 else f"base{b.slot}-{name}"

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write every adapter (peft format: ``adapter_model.safetensors`` +
        ``adapter_config.json`` directly in ``adapters/<name>/``) or, in full mode, each
        base's weights, plus ``policy.json``. Loadable by :meth:`load` (trainable) and by
        ``PeftModel.from_pretrained(base, dir/adapters/<name>, is_trainable=True)``."""
        from safetensors.torch import save_file, save_model

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "format": _FORMAT,
            "mode": self.mode,
            "roles": self.roles,
            "adapters": self._adapter_of,
            "bases": {r: self._base(r).name for r in self.roles},
            "lora": asdict(self.lora),
        }
        if self.mode == "full":
            for b in self._bases:
                d = out / "full" / f"base{b.slot}"
                d.mkdir(parents=True, exist_ok=True)
                save_model(b.model, str(d / "model.safetensors"))
        else:
            from peft.utils import get_peft_model_state_dict

            for b in self._bases:
                for name in dict.fromkeys(self._adapter_of[r] for r in b.roles):
                    d = out / "adapters" / self._adapter_dirname(b, name)
                    d.mkdir(parents=True, exist_ok=True)
                    sd = get_peft_model_state_dict(b.model, adapter_name=name)
                    save_file({k: v.detach().cpu().contiguous() for k, v in sd.items()}, str(d / "adapter_model.safetensors"))
                    b.model.peft_config[name].save_pretrained(str(d))
        (out / "policy.json").write_text(json.dumps(meta, indent=1))
        return out

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Load weights written by :meth:`save` into this policy, in place; every adapter
        is trainable afterwards (``requires_grad=True``), ready for a fresh optimizer."""
        from safetensors.torch import load_file, load_model

        src = Path(directory)
        meta_path = src / "policy.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{src} holds no policy.json (not a TeamPolicy.save directory)")
        meta = json.loads(meta_path.read_text())
        if meta.get("mode") != self.mode:
            raise ValueError(f"saved policy has mode {meta.get('mode')!r}, this one {self.mode!r}")
        missing = set(self.roles) - set(meta.get("roles", []))
        if missing:
            raise ValueError(f"saved policy lacks roles {sorted(missing)}")
        if self.mode == "full":
            for b in self._bases:
                load_model(b.model, str(src / "full" / f"base{b.slot}" / "model.safetensors"))
                for p in b.model.parameters():
                    p.requires_grad_(True)
            return
        done: set[tuple[int, str]] = set()
        for role in self.roles:
            b, name = self._base(role), self._adapter_of[role]
            if (b.slot, name) in done:
                continue
            done.add((b.slot, name))
            saved_name = meta["adapters"].get(role, name)
            f = src / "adapters" / self._adapter_dirname(b, saved_name) / "adapter_model.safetensors"
            if not f.is_file():
                raise FileNotFoundError(f"no saved adapter for role {role!r} at {f}")
            self.load_adapter_state_dict(role, load_file(str(f), device=str(self.device)))
        self.set_train_role(None)

    # ------------------------------------------------------------------------------------
    # memory
    # ------------------------------------------------------------------------------------
    def parameter_bytes(self) -> dict[str, int]:
        """Bytes of unique parameter storages: ``base``, ``adapters`` and ``total``."""
        seen: set[int] = set()
        base = adapters = 0
        for b in self._bases:
            adapter_ids = {id(p) for ps in b.adapter_params.values() for p in ps}
            modules = [b.model] + ([b.reference] if b.reference is not None else [])
            for m in modules:
                for t in list(m.parameters()) + list(m.buffers()):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr in seen or t.numel() == 0:
                        continue
                    seen.add(ptr)
                    nbytes = t.untyped_storage().nbytes()
                    if id(t) in adapter_ids:
                        adapters += nbytes
                    else:
                        base += nbytes
        return {"base": base, "adapters": adapters, "total": base + adapters}

    def __repr__(self) -> str:
        return f"TeamPolicy(roles={self.roles}, mode={self.mode!r}, bases={self.bases}, adapters={self._adapter_of})"
