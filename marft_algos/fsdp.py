"""Sharded training with FSDP2 (``distributed.strategy="fsdp"``): the team policy's weights,
gradients and optimizer states are split over the ranks.

:class:`PolicySharding` shards every model of a :class:`~marft_algos.models.TeamPolicy`
(the trained model, and in full fine-tuning the frozen reference copy) with FSDP2
``fully_shard``, each decoder layer and then the root; LoRA adapters (every role's, and any
extra adapter that exists when it is applied) live inside the layers and shard with them.

Phases of a step and what each rank holds:

- **Rollouts and no-grad scoring** (:meth:`PolicySharding.gathered`): generation runs a
  different number of forward passes on each rank (each rank's episodes end when they end),
  and every FSDP forward all-gathers weights, a collective that would then pair up wrongly
  and hang. So every rank all-gathers the whole model once (``unshard`` of every FSDP
  module, in lock-step), turns the per-forward re-sharding off, decodes on full local
  weights without a collective, and re-shards afterwards. The old / reference log-probs and
  the critic's features (no grad, chunk counts that differ by rank) run the same way.
  This is verl's hybrid-engine trade: the full weights are resident during rollouts;
  gradients and optimizer states stay sharded.
- **Training** (forward and backward with grad): sharded, FSDP2's own hooks all-gather
  each layer for its forward and backward and reduce-scatter its gradients. The number of
  training forwards is the same on every rank (the trainers agree on agents and minibatch
  counts first).
- **Checkpoints** (:meth:`PolicySharding.full_state`): every rank all-gathers the weights
  and the optimizer states, so rank 0 writes the one unsharded format a single process
  writes (it loads on any world size, with or without FSDP); loading copies full tensors
  into the shards (:meth:`PolicySharding.loading`, :func:`shard_optimizer_states`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from marft_algos.distributed import Distributed, shard_full_model

__all__ = ["PolicySharding", "is_sharded", "shard_optimizer_states", "full_grad_norm"]


def is_sharded(t: Any) -> bool:
    """Is ``t`` a ``DTensor`` (a sharded parameter, gradient or optimizer state)?"""
    # deferred: torch.distributed's FSDP stack loads only for sharded runs
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _fsdp_modules(roots: Iterable[nn.Module]) -> list[Any]:
    # deferred: torch.distributed's FSDP stack loads only for sharded runs
    from torch.distributed.fsdp import FSDPModule

    return [m for r in roots for m in r.modules() if isinstance(m, FSDPModule)]


def shard_optimizer_states(opt: torch.optim.Optimizer) -> None:
    """Turn the full (unsharded) state tensors of ``opt``'s sharded parameters into shards
    like their parameters (after ``opt.load_state_dict`` of a full checkpoint). No
    collective: every rank holds the full tensor and keeps its own chunk."""
    # deferred: torch.distributed's FSDP stack loads only for sharded runs
    from torch.distributed.tensor import distribute_tensor

    for group in opt.param_groups:
        for p in group["params"]:
            if not is_sharded(p) or p not in opt.state:
                continue
            st = opt.state[p]
            for k, v in list(st.items()):
                if torch.is_tensor(v) and not is_sharded(v) and v.shape == p.shape:
                    st[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)


def full_grad_norm(norm: torch.Tensor) -> float:
    """The total norm ``clip_grad_norm_`` returned: over all ranks' shards when its gradients
    were sharded (a collective), else the value itself."""
    return float(norm.full_tensor() if is_sharded(norm) else norm)


class PolicySharding:
    """FSDP2 over a ``TeamPolicy``'s models (see the module docstring).

    Shards in place at construction; every rank must construct it at the same point, after
    every adapter the run trains exists (the critic's included) with ``requires_grad`` set,
    and before any optimizer is built (optimizers are built on the sharded parameters).

    Args:
        policy: the team policy (one base: heterogeneous teams are refused by the trainer).
        dist: the process group (world size > 1).
    """

    def __init__(self, policy: Any, dist: Distributed) -> None:
        self.policy = policy
        self.dist = dist
        self._gathered_roots: set[int] = set()  # ids of the roots gathered by open gathered() blocks
        self._full = 0  # depth of nested full_state() blocks
        for b in policy.loaded_bases:
            shard_full_model(b.model, dist)
            if b.reference is not None:
                shard_full_model(b.reference, dist)
        # FSDP2 replaced the parameter objects by sharded ones: re-read the adapters' lists
        policy.reindex_parameters()
        # A prefix shared by several rows reaches the backward through the KV cache, not
        # through the layer outputs on which FSDP2 hooks its pre-backward all-gather (the
        # weights would be freed): training forwards run every row's full sequence.
        policy.share_prefixes_with_grad = False
        # The LM head's weights are resharded when the root's forward ends: a chunked head
        # run after it would read shards, so checkpointed forwards keep the full logits.
        policy.chunked_head = False
        # The first forward through a root makes it FSDP's root; run it here, in lock-step,
        # before a rollout or a critic reads the backbone directly (which would make a
        # decoder layer the root).
        with torch.no_grad():
            for root in self.roots(reference=True):
                root(input_ids=torch.zeros((1, 1), dtype=torch.long, device=policy.device))
        self.reshard()

    def reshard(self) -> None:
        """Put every model back in the sharded state (no collective). A forward leaves the
        root's own parameters (embeddings, head) gathered, and the module then holds plain
        tensors in their place; optimizers and checkpoints must see the shards."""
        for m in _fsdp_modules(self.roots(reference=True)):
            m.reshard()

    def roots(self, *, reference: bool = False) -> list[nn.Module]:
        """The sharded models: each base's trained model, and its reference copy if asked."""
        out: list[nn.Module] = []
        for b in self.policy.loaded_bases:
            out.append(b.model)
            if reference and b.reference is not None:
                out.append(b.reference)
        return out

    # ---- gathered phases (rollouts, no-grad scoring) ------------------------------------
    @contextlib.contextmanager
    def gathered(self, *, reference: bool = False) -> Iterator[None]:
        """Inside the block every rank holds the full weights and forwards issue no collective.

        Every rank must enter and leave it together (one all-gather of every FSDP module on
        entry). ``reference``: the frozen reference copy too (full fine-tuning). Nested
        blocks gather only what the outer ones have not.
        """
        roots = [r for r in self.roots(reference=reference) if id(r) not in self._gathered_roots]
        modules = _fsdp_modules(roots)
        for r in roots:
            r.set_reshard_after_forward(False)  # recursive: no re-shard after each forward
        for m in modules:
            m.unshard()
        self._gathered_roots.update(id(r) for r in roots)
        try:
            yield
        finally:
            self._gathered_roots.difference_update(id(r) for r in roots)
            for m in modules:
                m.reshard()
            for r in roots:  # FSDP2's defaults: layers re-shard after forward, the root does not
                r.set_reshard_after_forward(True)
                r.set_reshard_after_forward(False, recurse=False)

    # ---- checkpoints ----------------------------------------------------------------------
    @contextlib.contextmanager
    def full_state(self, optimizers: Sequence[torch.optim.Optimizer] = ()) -> Iterator[None]:
        """Inside the block the policy's parameters and ``optimizers``' states are full
        (unsharded) CPU tensors, for ``policy.save`` / ``state_dict`` in the single-process
        format (gathered one tensor at a time: the device holds one full tensor at most).

        Every rank must enter it (the all-gathers are collectives, in the same order
        everywhere); values are read-only inside (they are copies). Re-entrant.
        """
        if self._full:
            self._full += 1
            try:
                yield
            finally:
                self._full -= 1
            return
        if self._gathered_roots:
            raise RuntimeError("full_state() inside gathered(): save or load checkpoints outside rollouts and scoring")
        roots = self.roots()
        self.reshard()  # a forward leaves the root unsharded: start from shards everywhere
        swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
        full_of: dict[int, nn.Parameter] = {}
        saved_states: list[tuple[dict[str, Any], str, torch.Tensor]] = []
        self._full = 1
        try:
            with torch.no_grad():
                for root in roots:
                    for mod in root.modules():
                        for name, p in list(mod._parameters.items()):
                            if p is None or not is_sharded(p):
                                continue
                            if id(p) not in full_of:  # tied weights stay one tensor
                                full_of[id(p)] = nn.Parameter(p.full_tensor().cpu(), requires_grad=p.requires_grad)
                            swapped.append((mod, name, p))
                            mod._parameters[name] = full_of[id(p)]
                for opt in {id(o): o for o in optimizers}.values():
                    for group in opt.param_groups:
                        for p in group["params"]:
                            st = opt.state.get(p, {})
                            for k in sorted(st):
                                if is_sharded(st[k]):
                                    saved_states.append((st, k, st[k]))
                                    st[k] = st[k].full_tensor().cpu()
            yield
        finally:
            self._full = 0
            for st, k, v in saved_states:
                st[k] = v
            for mod, name, p in reversed(swapped):
                mod._parameters[name] = p

    @staticmethod
    @contextlib.contextmanager
    def loading() -> Iterator[None]:
        """Inside the block a full tensor copies into a sharded parameter (``load_state_dict``,
        peft's ``set_peft_model_state_dict``): each rank keeps its chunk, no collective."""
        # deferred: torch.distributed's FSDP stack loads only for sharded runs
        from torch.distributed.tensor.experimental import implicit_replication

        with implicit_replication():
            yield

    def check_homogeneous(self, params: Sequence[torch.Tensor]) -> None:
        """One optimizer's parameters are all sharded or all replicated (``clip_grad_norm_``
        cannot mix them)."""
        kinds = {is_sharded(p) for p in params}
        if len(kinds) > 1:
            raise ValueError(
                "an optimizer mixes FSDP-sharded parameters with replicated ones (e.g. a critic LoRA adapter with its "
                "value head): not supported with distributed.strategy='fsdp'"
            )
