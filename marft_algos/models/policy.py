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

The policy owns the weights: adapter management, training-time scoring
(:meth:`TeamPolicy.sequence_logprobs`, :meth:`TeamPolicy.hidden_states` on the public
:class:`~marft_algos.models.layout.Layout`) and save/load. Sampling is done by a
generation engine (:mod:`marft_algos.engines`; the default ``"hf"`` engine is the
KV-cached multi-adapter decode loop on these same model objects), to which
:meth:`TeamPolicy.generate` delegates.

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
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file, save_model
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer

from marft_algos.models.chat import encode_chat
from marft_algos.models.chunked_head import (
    chunked_head_stats,
    hidden_instead_of_logits,
    supports_chunked_head,
    token_stats,
)
from marft_algos.models.compat import cache_kwarg, quiet_peft_checkpointing_probe
from marft_algos.models.layout import Layout, build_layout
from marft_algos.models.loading import load_base, parse_dtype
from marft_algos.models.prefix import plan_prefixes, two_stage_forward
from marft_algos.models.sampling import GenRequest, GenResult, TokenStats

__all__ = ["AdapterNameError", "LoadedBase", "LoraSettings", "TeamPolicy", "adapter_names", "train_mode"]

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
        # deferred: peft loads on first use (heavy)
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
class LoadedBase:
    """One loaded base model and the roles that run on it (an engine decodes per base).

    Attributes:
        slot: index of this base in :attr:`TeamPolicy.loaded_bases`.
        name: the alias/path/Hub id it was loaded from.
        model: a PeftModel in lora/shared mode, the plain model in full mode.
        tokenizer: its tokenizer (left padding, a pad token set).
        roles: the roles that run on it.
        max_context: prompt + response token limit.
        eos_ids: token ids that end a generation.
        reference: the frozen initial copy (full mode with ``full_reference``).
        tuner_layers: the peft tuner layers (adapter switches).
        adapter_params: the parameters of each adapter, by adapter name.
        ckpt_layers: decoder layers armed for activation checkpointing.
    """

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


@contextlib.contextmanager
def train_mode(module: nn.Module, train: bool) -> Iterator[None]:
    """Set ``module.train(train)`` inside the block; restores the previous mode."""
    was = module.training
    module.train(train)
    try:
        yield
    finally:
        module.train(was)


def _sanitize(name: str) -> str:
    """peft adapter names become ModuleDict keys: no dots, not empty."""
    clean = re.sub(r"[^0-9A-Za-z_\-]", "_", name) or "adapter"
    # peft reserves these / matches by substring; "__" names are internal (the critic's adapter)
    if clean in "lora_" or clean in ("__base__", "default") or clean.startswith("__"):
        clean = f"role_{clean}"
    return clean


class AdapterNameError(ValueError):
    """Two roles whose adapter names become one after sanitising (they would share one adapter)."""


def adapter_names(roles: Sequence[str], adapters: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each role's peft adapter name (``adapters[role]`` or the role, sanitised).

    Sanitising is not one-to-one (``solver.v2`` and ``solver_v2`` both become ``solver_v2``;
    ``a`` becomes ``role_a``): two roles that asked for different adapters but would land
    on one name would silently train and save a single adapter, so that team is refused
    with :class:`AdapterNameError`. Roles that name the same adapter in ``adapters`` share it.
    """
    wanted = {r: (adapters or {}).get(r, r) for r in roles}
    out = {r: _sanitize(w) for r, w in wanted.items()}
    asked: dict[str, dict[str, list[str]]] = {}
    for r, name in out.items():
        asked.setdefault(name, {}).setdefault(wanted[r], []).append(r)
    clashes = {name: by for name, by in asked.items() if len(by) > 1}
    if clashes:
        lines = "; ".join(
            f"{' and '.join(repr(r) for rs in by.values() for r in rs)} all become adapter {name!r}"
            for name, by in clashes.items()
        )
        raise AdapterNameError(
            f"role names collide after sanitising into adapter names ({lines}): only one adapter would be "
            "trained and saved. Rename a role so that the names differ in letters, digits, '_' or '-' "
            "(dots and other characters become '_'; a name inside 'lora_' such as 'a' becomes 'role_a')"
        )
    return out


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
    state = _tuner_state(tuners)

    def replay(*a: Any, **k: Any) -> Any:
        now = _tuner_state(tuners)
        _set_tuner_state(tuners, state)
        try:
            return fn(*a, **k)
        finally:
            _set_tuner_state(tuners, now)

    return checkpoint(replay, *args, use_reentrant=False, **kwargs)


def _load_full_weights(model: nn.Module, path: Path, device: torch.device) -> None:
    """Load a ``save_model`` file into ``model`` in place (strict; a tied weight saved once
    under one of its names loads through its alias). Unlike safetensors' ``load_model`` it
    never reads storage pointers, so FSDP2-sharded (``DTensor``) parameters load too."""
    state = load_file(str(path), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    aliased = {n for names in names_of.values() if any(m in state for m in names) for n in names}
    missing = [k for k in missing if k not in aliased]
    if missing or unexpected:
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += f"\n    Missing key(s) in state_dict: {', '.join(sorted(missing))}"
        if unexpected:
            error += f"\n    Unexpected key(s) in state_dict: {', '.join(sorted(unexpected))}"
        raise RuntimeError(error)


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
            model whose decoder layers support gradient checkpointing. With or without it,
            the LM head of every scoring forward runs over chunks of tokens, recomputed in
            the backward (:mod:`marft_algos.models.chunked_head`), so no ``[tokens, vocab]``
            logits are kept.
        engine: the generation engine's registry name (:func:`marft_algos.engines.get_engine`;
            ``"hf"``: the KV-cached decode loop on this policy's models).
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
        engine: str = "hf",
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
        # refused before any model loads: two roles on one adapter name
        names = adapter_names(roles, adapters) if mode == "lora" else {}
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
        # FSDP2 turns this off: a shared prefix's gradient reaches its layers through the KV
        # cache, past the layer outputs where FSDP re-gathers the weights for the backward
        self.share_prefixes_with_grad = True
        self.activation_checkpointing = bool(activation_checkpointing)
        # scoring forwards run the LM head in recomputed chunks (chunked_head);
        # FSDP2 turns it off: the head's weights are resharded once the model's forward ends
        self.chunked_head = True
        self.seed = seed
        self.stats: Counter[str] = Counter()
        self._train_role: str | None = None
        # (slot, role adapter) -> its frozen reference copy (freeze_reference); absent: the bare base
        self._reference_adapter: dict[tuple[int, str], str] = {}

        # ---- load each distinct base once ------------------------------------------------
        spec_of = {r: (base.get(r, "smollm2-135m") if isinstance(base, Mapping) else base) for r in roles}
        self._bases: list[LoadedBase] = []
        self._base_of: dict[str, LoadedBase] = {}
        by_key: dict[Any, LoadedBase] = {}
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
                entry = LoadedBase(len(self._bases), name, model, tokenizer, [], limit, _eos_ids(model, tokenizer))
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
                self._adapter_of[role] = names[role]
        for b in self._bases:
            if mode == "full":
                self._setup_full(b, full_reference)
            else:
                names = list(dict.fromkeys(self._adapter_of[r] for r in b.roles))
                self._setup_lora(b, names)
            b.ckpt_layers = self._checkpoint_layers(b) if self.activation_checkpointing else []

        # ---- the generation engine -------------------------------------------------------
        # deferred: engines build on this module (marft_algos.engines imports marft_algos.models)
        from marft_algos.engines import get_engine

        self.engine = get_engine(engine)(self)

    # ------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------
    def _setup_lora(self, b: LoadedBase, names: list[str]) -> None:
        # deferred: peft loads on first use (heavy)
        from peft import get_peft_model

        cfg = self.lora.to_peft()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            with quiet_peft_checkpointing_probe():
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
    def _checkpoint_layers(b: LoadedBase) -> list[nn.Module]:
        """Arm transformers' per-layer checkpointing (non-reentrant) on ``b``'s decoder layers.

        The layers checkpoint only while their own ``training`` flag is set, which
        :meth:`_checkpointing` does for training forwards alone (non-recursively: dropout
        modules stay in eval mode, so the recomputation is the same function). The
        backward pass recomputes a layer after :meth:`use_adapter` has restored the adapter
        selection, so each layer's recomputation re-activates the adapters that were
        active in its forward.
        """
        # deferred: peft loads on first use (heavy)
        from peft.tuners.tuners_utils import BaseTunerLayer

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
    def _checkpointing(self, b: LoadedBase) -> Iterator[None]:
        """Checkpoint ``b``'s decoder layers inside this block (a no-op when not armed)."""
        was = [layer.training for layer in b.ckpt_layers]
        for layer in b.ckpt_layers:
            layer.training = True
        try:
            yield
        finally:
            for layer, w in zip(b.ckpt_layers, was, strict=True):
                layer.training = w

    def _index_adapters(self, b: LoadedBase) -> None:
        # deferred: peft loads on first use (heavy)
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

    def reindex_parameters(self) -> None:
        """Re-read every base's adapter parameter lists from its modules: after a wrapper that
        replaces parameter objects (FSDP2 ``fully_shard`` makes them sharded ``DTensor``s),
        :meth:`trainable_parameters` and :meth:`set_train_role` then act on the new ones."""
        for b in self._bases:
            if b.tuner_layers:
                self._index_adapters(b)

    def _setup_full(self, b: LoadedBase, keep_reference: bool) -> None:
        if keep_reference:
            self._copy_reference(b)
        for p in b.model.parameters():
            p.requires_grad_(True)

    @staticmethod
    def _copy_reference(b: LoadedBase) -> None:
        """``b.reference`` = a frozen copy of ``b.model``'s current weights (full mode)."""
        b.reference = copy.deepcopy(b.model).eval()
        for p in b.reference.parameters():
            p.requires_grad_(False)

    def add_adapter(self, role_or_slot: str | int, name: str, lora: LoraSettings | None = None) -> list[nn.Parameter]:
        """Add an extra adapter (e.g. the critic's) to a base; returns its (trainable) params.

        Used by :class:`ValueModel`; policy adapters' ``requires_grad`` flags are preserved.
        """
        if self.mode == "full":
            raise ValueError("mode='full' has no peft wrapper to add an adapter to")
        b = self._bases[role_or_slot] if isinstance(role_or_slot, int) else self._base_of[role_or_slot]
        # internal names ("__critic__") are kept as they are: role adapters never start with "__"
        name = name if name.startswith("__") and "." not in name else _sanitize(name)
        if name in {self._adapter_of[r] for r in b.roles}:
            raise ValueError(f"adapter name {name!r} is a role's adapter: give the extra adapter a '__' name")
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

    def freeze_reference(self) -> None:
        """Make the current weights the reference policy of ``reference=True`` scoring (the KL
        penalty and its diagnostics), frozen from now on: after an SFT warm start, RL is then
        held near the SFT policy, not the base. LoRA/shared: a frozen copy of each role adapter
        (``__ref__<name>``, never trained or saved); full: a new frozen copy of each base."""
        # deferred: peft loads on first use (heavy)
        from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

        for b in self._bases:
            if self.mode == "full":
                self._copy_reference(b)
                continue
            for name in dict.fromkeys(self._adapter_of[r] for r in b.roles):
                assert name is not None
                ref = self._reference_adapter.setdefault((b.slot, name), f"__ref__{name}")
                self.add_adapter(b.slot, ref)
                set_peft_model_state_dict(b.model, get_peft_model_state_dict(b.model, adapter_name=name), adapter_name=ref)
                for p in b.adapter_params[ref]:
                    p.requires_grad_(False)

    # ------------------------------------------------------------------------------------
    # lookups
    # ------------------------------------------------------------------------------------
    def _base(self, role: str) -> LoadedBase:
        try:
            return self._base_of[role]
        except KeyError:
            raise KeyError(f"unknown role {role!r}; roles: {self.roles}") from None

    def loaded_base(self, role: str) -> LoadedBase:
        """The :class:`LoadedBase` that runs ``role`` (its model, tokenizer, adapters)."""
        return self._base(role)

    @property
    def loaded_bases(self) -> list[LoadedBase]:
        """Every distinct loaded base, in slot order."""
        return list(self._bases)

    def reference_model(self, role: str) -> nn.Module | None:
        """The frozen copy of the initial weights under ``role`` (mode ``"full"`` with
        ``full_reference=True``; after :meth:`freeze_reference`, of the weights then), else
        None (lora/shared: the reference is the base with adapters disabled, or the frozen
        adapter copy of :meth:`freeze_reference`)."""
        return self._base(role).reference

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
    def encode(self, role: str, messages: Sequence[Mapping[str, str]], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of ``messages`` through the tokenizer's chat template + generation prompt.

        Message contents stay literal text (:func:`marft_algos.models.chat.encode_chat`):
        a teammate's ``<|im_start|>system`` is never a real turn marker. ``tools``: function
        schemas for the template's ``tools=`` (``env.tools(agent)``)."""
        tok = self._base(role).tokenizer
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"the tokenizer of role {role!r} has no chat template")
        return encode_chat(tok, messages, add_generation_prompt=True, tools=tools)

    # ------------------------------------------------------------------------------------
    # forward helpers
    # ------------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The compute-dtype autocast for a forward (a no-op in fp32)."""
        # Any device: an explicit dtype='bf16'/'fp16' on CPU runs reduced precision too
        # (slow there; it is how the fp16 loss-scaling path is tested without a GPU).
        if self.compute_dtype in (torch.bfloat16, torch.float16):
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    _autocast = autocast

    @contextlib.contextmanager
    def use_adapter(self, where: str | LoadedBase, adapter: str | None, *, disabled: bool = False) -> Iterator[None]:
        """Activate one adapter of a base (a role's base, or a :class:`LoadedBase`) for
        plain forwards inside the block; ``adapter=None`` or ``disabled=True`` runs the
        bare base. Restores the previous selection afterwards."""
        b = self._base(where) if isinstance(where, str) else where
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
    def merged_adapter(self, b: LoadedBase, adapter: str) -> Iterator[bool]:
        """Fold ``adapter`` into the base weights for a no-grad decode; yields whether it did.

        A decode step of a 135M model on a CPU spends ~15% of its time in the LoRA side
        paths (two small matmuls and peft's dispatch per adapted linear). With one adapter
        for the whole batch, ``W + scale * B @ A`` is computed once per decode round and the
        adapters are switched off; the original weight tensors are put back afterwards
        (exactly: the same tensor objects, no subtract-to-unmerge rounding).
        """
        # deferred: peft loads on first use (heavy)
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
            with self.use_adapter(b, None, disabled=True):
                yield True
        finally:
            for w, data in saved:
                w.data = data

    _merged = merged_adapter

    # ------------------------------------------------------------------------------------
    # generation (delegated to the engine)
    # ------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> list[GenResult]:
        """Generate one result per request (``n`` results for a request with ``n > 1``,
        consecutively) with :attr:`engine`.

        With the ``hf`` engine, all roles that share a base decode in one loop and
        identical prompts of the same adapter are prefilled once. A request whose
        ``len(prompt) + max_new_tokens`` exceeds ``max_context`` gets
        ``finish_reason="context"`` and an empty action (counted in
        ``stats["context_overflow"]``); prompts are never truncated.
        """
        return self.engine.generate(requests, seed=seed)

    def generate_groups(self, request: GenRequest, n: int, *, seed: int | None = None) -> list[GenResult]:
        """``n`` samples of one prompt (a GRPO group): one prefill, KV cache expanded to n rows."""
        return self.engine.generate_groups(request, n, seed=seed)

    def generate_stream(
        self, requests: Iterable[tuple[Hashable, GenRequest]], on_done: Callable[[Any, GenResult], Any], *, seed: int | None = None
    ) -> None:
        """Generate keyed requests, calling ``on_done(key, result)`` as each finishes; the
        ``(key, request)`` pairs it returns are generated too
        (:meth:`~marft_algos.engines.base.GenerationEngine.generate_stream`; with the
        ``hf`` engine they join the running batch: continuous batching)."""
        self.engine.generate_stream(requests, on_done, seed=seed)

    # ------------------------------------------------------------------------------------
    # training-time log-probs
    # ------------------------------------------------------------------------------------
    def layout(self, role: str, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> Layout:
        """``prompt + response`` rows of ``role`` as a :class:`~marft_algos.models.layout.Layout`
        (prompts left-padded with its tokenizer's pad id, responses right-padded; the
        layout of decoding), on the policy's device."""
        tok = self._base(role).tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        return build_layout(prompt_ids, response_ids, pad_id=pad, device=self.device)

    def hidden_states(
        self,
        role: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        adapter: str | None = None,
    ) -> torch.Tensor:
        """Last-layer hidden states ``[B, L, H]`` (no lm_head) of ``role``'s base.

        ``adapter=None``: the untrained base, without grad: in lora/shared mode the base
        with every adapter disabled, in full mode the frozen initial copy (or the shared
        model itself without ``full_reference``). ``adapter="name"`` (lora/shared): that
        adapter (e.g. the critic's, see :meth:`add_adapter`) is active and the forward
        keeps grad. Runs under the policy's autocast.
        """
        b = self._base(role)
        if self.mode == "full" and adapter is not None:
            raise ValueError("mode='full' has no adapters: call hidden_states with adapter=None")
        owner = (b.reference if b.reference is not None else b.backbone_owner) if self.mode == "full" else b.backbone_owner
        backbone = getattr(owner, owner.base_model_prefix)
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        with self.autocast():
            if self.mode == "full":
                with torch.no_grad():
                    return backbone(**kwargs).last_hidden_state
            if adapter is not None:
                with self.use_adapter(b, adapter):
                    return backbone(**kwargs).last_hidden_state
            with torch.no_grad(), self.use_adapter(b, None, disabled=True):
                return backbone(**kwargs).last_hidden_state

    def sequence_logprobs(
        self,
        role: str,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        reference: bool = False,
        dropout: bool = False,
        entropy_grad: bool = True,
    ) -> TokenStats:
        """Log-probs and entropies of ``response_ids`` given ``prompt_ids`` under ``role``.

        A batched forward on exactly ``prompt + response`` (prompts left-padded,
        responses right-padded), with grad unless called under ``torch.no_grad()``. A
        prompt prefix shared by several rows (a GRPO group; an agent's system prompt and
        problem) runs once and the rows continue from its cache (``share_prefixes``):
        the same tokens in the same context, fewer of them to run and backpropagate.
        ``reference=True`` evaluates the reference policy: the base with adapters disabled
        (lora/shared) or the frozen initial copy (full), or the weights
        :meth:`freeze_reference` froze; always without grad.

        Dropout (LoRA dropout, and any dropout of the base model) is off unless
        ``dropout=True``: the sampler runs without it, so a PPO ratio between these
        log-probs and the sampled ones compares the same deterministic function (a forward
        with dropout would put mask noise into every ratio and KL).

        ``entropy_grad=False`` returns the entropies without a graph (a loss without an
        entropy bonus): autograd saves no vocab-sized tensor for them. With the full head the
        forward's peak is the same either way (the logits and log-softmax are there at
        once); with the chunked head each chunk's recomputation also skips the entropy's graph.

        Returns:
            :class:`TokenStats` with ``[B, T]`` tensors, ``T`` = longest response; the
            distribution is ``softmax(logits / temperature)`` (matches sampling).
        """
        b = self._base(role)
        ids, att, pos, resp, rmask, plen, rlen = self.layout(role, prompt_ids, response_ids)
        n = ids.shape[0]
        if rlen == 0:
            z = torch.zeros((n, 0), device=self.device)
            return TokenStats(z, z.clone(), z.clone())
        stack = contextlib.ExitStack()
        if reference:
            stack.enter_context(torch.no_grad())
            stack.enter_context(self.autocast())
            if self.mode == "full":
                if b.reference is None:
                    raise ValueError("reference=True in mode='full' needs full_reference=True")
                model = b.reference
            else:
                model = b.model
                frozen = self._reference_adapter.get((b.slot, self._adapter_of[role] or ""))
                stack.enter_context(self.use_adapter(b, frozen, disabled=frozen is None))
                stack.enter_context(train_mode(b.model, False))
        else:
            model = b.model
            stack.enter_context(self.autocast())
            stack.enter_context(train_mode(b.model, dropout))
            if self.mode != "full":
                stack.enter_context(self.use_adapter(b, self._adapter_of[role]))
        # (with dropout on, a recomputed layer would draw new masks: no checkpointing)
        checkpointed = bool(b.ckpt_layers) and not reference and not dropout and torch.is_grad_enabled()
        if checkpointed:
            stack.enter_context(self._checkpointing(b))
        # a forward with grad shares prefixes unless a sharded model forbids it (see share_prefixes_with_grad)
        share = self.share_prefixes and not checkpointed and (self.share_prefixes_with_grad or not torch.is_grad_enabled())
        plan = plan_prefixes(prompt_ids) if share else None
        # the head runs over chunks of tokens (recomputed in the backward): no [tokens, vocab]
        # logits, log-softmax and entropy tensors of the whole forward (issue 28 item 24)
        chunked = self.chunked_head and supports_chunked_head(model)
        with stack:
            head_only = hidden_instead_of_logits(model) if chunked else contextlib.nullcontext(None)
            if plan is None:
                kwargs = dict(input_ids=ids[:, :-1], attention_mask=att[:, :-1], position_ids=pos[:, :-1], use_cache=False, logits_to_keep=rlen)
                with head_only as head:
                    logits = model(**kwargs).logits
            else:
                cache = DynamicCache()

                def run(*, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, adapters: Any, keep: int) -> Any:
                    kv = {cache_kwarg(model): cache}
                    return model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=keep, **kv)

                pad = b.tokenizer.pad_token_id if b.tokenizer.pad_token_id is not None else 0
                # response tokens follow the left-padded suffixes; the last input column is
                # dropped (nothing to predict after it), as in the one-stage layout
                tail_ids, tail_mask = resp[:, :-1], (rmask[:, :-1] > 0).long()
                with head_only as head:
                    out, _ = two_stage_forward(
                        run, cache, prompt_ids, plan, [None] * plan.num_clusters, [None] * n, pad, self.device, tail_ids, tail_mask, keep=rlen
                    )
                logits = out.logits
                self.stats["train_prefix_saved"] += sum(len(p) for p in prompt_ids) - plan.tokens(prompt_ids)
            if head is not None:  # ``logits`` are the final hidden states
                logp, entropy = chunked_head_stats(head, logits, resp, temperature=temperature, entropy_grad=entropy_grad)
            else:
                logp, entropy = token_stats(logits, resp, temperature=temperature, entropy_grad=entropy_grad)
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
        # deferred: peft loads on first use (heavy)
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
        # deferred: peft loads on first use (heavy)
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
    def _adapter_dirname(self, b: LoadedBase, name: str) -> str:
        return name if len(self._bases) == 1 else f"base{b.slot}-{name}"

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write every adapter (peft format: ``adapter_model.safetensors`` +
        ``adapter_config.json`` directly in ``adapters/<name>/``) or, in full mode, each
        base's weights, plus ``policy.json``. Loadable by :meth:`load` (trainable) and by
        ``PeftModel.from_pretrained(base, dir/adapters/<name>, is_trainable=True)``."""
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
            # deferred: peft loads on first use (heavy)
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
                _load_full_weights(b.model, src / "full" / f"base{b.slot}" / "model.safetensors", self.device)
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
