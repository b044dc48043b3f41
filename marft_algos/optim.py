"""Named parameter groups, their optimizers and schedulers, and the one guarded optimizer step.

An algorithm's loss terms each train one named group (:class:`OptimizerSet`):

- ``policy`` of agent ``a`` trains group ``a`` (agents that share parameters, e.g.
  ``mode="shared"``, share one optimizer object under several names);
- ``critic`` (MARFT's shared value model) trains :data:`CRITIC_KEY`;
- ``value`` of agent ``a`` (IPPO's value heads) trains :func:`value_key` ``(a)``.

Internal group names live in the reserved ``__`` namespace (roles may not start with it,
see ``TrainConfig.check_agents``), so a role named "critic" never shares a group with the
value model. :meth:`OptimizerSet.step` is the only place where gradients reach weights:
a non-finite loss or gradient (on any rank) skips the step and is counted, gradients are
all-reduced across ranks and clipped, the fp16 scaler is applied, and a veto (the KL hard
cut) can refuse a policy step. Schedulers follow the run's clock, the training step
(:meth:`OptimizerSet.schedule`): warm-up and decay do not depend on how often a group steps.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from marft_algos.fsdp import full_grad_norm, is_sharded

__all__ = ["CRITIC_KEY", "INTERNAL_KEY_PREFIX", "OptimizerSet", "group_key", "lr_factor", "metric_prefix", "value_key"]

#: prefix of every internal group name (never a role)
INTERNAL_KEY_PREFIX = "__"
#: the MARFT critic's group
CRITIC_KEY = "__critic__"

log = logging.getLogger("marft")


def value_key(agent: str) -> str:
    """IPPO's group of ``agent``'s value head (internal namespace, never a role)."""
    return f"__value__/{agent}"


def group_key(term: str, agent: str) -> str:
    """The group a loss ``term`` of ``agent``'s minibatch trains."""
    if term == "policy":
        return agent
    if term == "critic":
        return CRITIC_KEY
    if term == "value":
        return value_key(agent)
    raise ValueError(f"unknown loss term {term!r}: one of 'policy', 'critic', 'value'")


def metric_prefix(key: str, agent: str) -> str:
    """Metric namespace of group ``key`` stepped on ``agent``'s minibatch:
    ``agent/<agent>`` for its policy, ``critic`` / ``value/<agent>`` for internal ones."""
    if key == agent:
        return f"agent/{agent}"
    return key.replace("__", "") if key.startswith(INTERNAL_KEY_PREFIX) else key


def lr_factor(step: int, *, warmup: int, total: int, kind: str) -> float:
    """The learning-rate multiplier at training step ``step`` (0-based): linear warm-up over
    ``warmup`` steps, then constant or linear decay reaching 0 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "linear" and total > warmup:
        return max(0.0, 1.0 - (step - warmup) / (total - warmup))
    return 1.0


class OptimizerSet:
    """Optimizers and schedulers by group name, the guarded step, skip counters.

    Args:
        max_grad_norm: clip each group's gradient to this norm (``<= 0``: no clipping).
        dist: the run's :class:`~marft_algos.distributed.Distributed` (collectives are
            no-ops on one process).
        counters: the trainer's cumulative counters (skips are counted there).
        scaler: the fp16 ``GradScaler``, or None.
        sharding: the FSDP2 sharding, or None.
    """

    def __init__(self, *, max_grad_norm: float, dist: Any, counters: dict[str, float], scaler: Any = None, sharding: Any = None) -> None:
        self.max_grad_norm = max_grad_norm
        self.dist = dist
        self.counters = counters
        self.scaler = scaler
        self.sharding = sharding
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        self.steps: dict[str, int] = defaultdict(int)
        self._by_params: dict[tuple[int, ...], torch.optim.Optimizer] = {}
        self._unscaled = False  # an fp16 scaling round is open (some group was unscaled)

    # ---- building ---------------------------------------------------------------------
    def add(self, key: str, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float = 0.01, eps: float = 1e-8) -> None:
        """An AdamW for group ``key`` (the same parameters as an existing group: one shared optimizer);
        ``weight_decay`` defaults to AdamW's own (value models; policies take ``config.weight_decay``)."""
        params = list(params)
        if not params:
            raise RuntimeError(f"group {key!r} has no trainable parameters")
        ids = tuple(sorted(id(p) for p in params))
        opt = self._by_params.get(ids)
        if opt is None:
            opt = self._by_params[ids] = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)
        self.optimizers[key] = opt

    def add_schedules(self, factor: Callable[[int], float]) -> None:
        """One LambdaLR per distinct optimizer, driven by :meth:`schedule`."""
        made: dict[int, torch.optim.lr_scheduler.LambdaLR] = {}
        for key, opt in self.optimizers.items():
            if id(opt) not in made:
                made[id(opt)] = torch.optim.lr_scheduler.LambdaLR(opt, factor)
            self.schedulers[key] = made[id(opt)]

    def unique(self) -> list[torch.optim.Optimizer]:
        """Each optimizer object once (shared ones are listed under several names)."""
        return list({id(o): o for o in self.optimizers.values()}.values())

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every trained parameter once."""
        return list({id(p): p for o in self.unique() for g in o.param_groups for p in g["params"]}.values())

    def schedule(self, step: int) -> None:
        """Set every group's learning rate to its factor at training step ``step``."""
        for sched in {id(s): s for s in self.schedulers.values()}.values():
            lrs = [base * f(step) for base, f in zip(sched.base_lrs, sched.lr_lambdas, strict=True)]
            for g, lr in zip(sched.optimizer.param_groups, lrs, strict=True):
                g["lr"] = lr
            sched.last_epoch, sched._last_lr = step, lrs

    # ---- the step ------------------------------------------------------------------------
    def zero_grad(self, key: str) -> None:
        """Clear group ``key``'s gradients."""
        self.optimizers[key].zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, weight: float = 1.0) -> None:
        """Back-propagate ``loss`` (fp16: scaled; FSDP: weighted by this rank's share ``weight``
        of the units, because FSDP reduce-scatters the plain mean of the ranks' gradients)."""
        if self.sharding is not None:
            total_w = self.dist.sum([weight])[0]
            loss = loss * (weight * self.dist.world_size / total_w if total_w > 0 else 0.0)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(
        self,
        key: str,
        agent: str,
        loss: torch.Tensor,
        metrics: dict[str, float],
        *,
        weight: float = 1.0,
        accumulated: bool = False,
        veto: Callable[[dict[str, float]], bool] | None = None,
    ) -> tuple[bool, float | None]:
        """Backward (unless ``accumulated``), all-reduce, clip and step group ``key``, guarded.

        ``loss`` is the term's loss on ``agent``'s minibatch, or with ``accumulated`` the
        detached total of gradients already in place. ``weight``: this rank's share of the
        term's units (ranks' gradients are averaged by it). ``veto(metrics)`` True refuses
        the step (gradients dropped). Returns (stepped, grad norm or None).
        """
        opt = self.optimizers[key]
        if not accumulated:
            opt.zero_grad(set_to_none=True)
        if self.dist.any(not torch.isfinite(loss.detach()).all()):  # one rank's NaN skips every rank's step
            self._skip_nonfinite(agent, "loss", opt)
            return False, None
        if not accumulated:
            self.backward(loss, weight)
        params = [p for g in opt.param_groups for p in g["params"]]
        if self.dist.active:  # the gradient and metrics of all ranks' data (see marft_algos.distributed)
            if self.sharding is None:
                self.dist.all_reduce_grads(params, weight)
            else:  # sharded ones were reduced by FSDP; replicated ones (value heads) carry the scaled loss
                self.dist.all_reduce_grads([p for p in params if not is_sharded(p)], 1.0)
            metrics.update(self.dist.mean_metrics(metrics, weight))
        if self.scaler is not None:
            self.scaler.unscale_(opt)  # clip and check the true gradients
            self._unscaled = True
        with_grad = [p for p in params if p.grad is not None]
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        # error_if_nonfinite=False: we check ourselves and skip instead of raising
        norm = full_grad_norm(torch.nn.utils.clip_grad_norm_(with_grad, max_norm)) if with_grad else None
        if norm is not None and not math.isfinite(norm):
            if self.scaler is not None:  # an fp16 overflow is the scaler's business (end_round lowers the scale)
                self._skip(agent, "amp_overflow_skips", opt)
            else:
                self._skip_nonfinite(agent, "grad", opt)
            return False, norm
        if veto is not None and veto(metrics):
            opt.zero_grad(set_to_none=True)
            return False, norm
        if self.scaler is not None:
            self.scaler.step(opt)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        self.steps[key] += 1
        return True, norm

    def zero_gradient_step(self, key: str, agent: str, loss: torch.Tensor, metrics: dict[str, float], **kw: Any) -> tuple[bool, float | None]:
        """:meth:`step` of group ``key`` for a ``loss`` that is identically 0 (detached; still
        checked for being finite), without its backward: every parameter gets the zero gradient
        the backward would give, so AdamW's momentum and weight decay still move the weights
        and ranks still all-reduce. ``kw``: as :meth:`step` (``accumulated`` is implied)."""
        opt = self.optimizers[key]
        opt.zero_grad(set_to_none=True)
        for g in opt.param_groups:
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        return self.step(key, agent, loss, metrics, **{**kw, "accumulated": True})

    def snapshot(self, key: str) -> tuple[list[torch.Tensor], dict[str, Any], int]:
        """Group ``key``'s parameters and optimizer state, to undo a step (:meth:`restore`)."""
        opt = self.optimizers[key]
        params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
        return params, copy.deepcopy(opt.state_dict()), self.steps[key]

    def restore(self, key: str, snap: tuple[list[torch.Tensor], dict[str, Any], int]) -> None:
        """Undo group ``key``'s steps since :meth:`snapshot` (weights, optimizer state, step
        count). The snapshot stays as it was: it can be restored again."""
        params, state, steps = snap
        opt = self.optimizers[key]
        with torch.no_grad():
            for p, saved in zip((p for g in opt.param_groups for p in g["params"]), params, strict=True):
                p.copy_(saved)
        opt.load_state_dict(copy.deepcopy(state))  # load_state_dict keeps the tensors: later steps would change them in place
        self.steps[key] = steps

    def end_round(self) -> None:
        """Close one minibatch's scaling round (fp16): the scale grows, or drops after an
        overflow. Once per minibatch, after all its groups stepped: every group's gradients
        were scaled by the same scale."""
        if self.scaler is not None and self._unscaled:
            self.scaler.update()
        self._unscaled = False

    def _skip(self, agent: str, counter: str, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=True)
        self.counters[f"train/{counter}"] += 1
        self.counters[f"agent/{agent}/{counter}"] += 1

    def _skip_nonfinite(self, agent: str, where: str, opt: torch.optim.Optimizer) -> None:
        self._skip(agent, "nonfinite_skips", opt)
        log.warning("agent %s: non-finite %s, optimizer step skipped (total skips: %d)",
                    agent, where, int(self.counters["train/nonfinite_skips"]))

    # ---- checkpoint ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer states by group (a shared optimizer once, the others as aliases),
        scheduler states, step counts and the scaler's state."""
        seen: dict[int, str] = {}
        opts: dict[str, Any] = {}
        for k, opt in self.optimizers.items():
            if id(opt) in seen:
                opts[k] = {"alias_of": seen[id(opt)]}
            else:
                seen[id(opt)] = k
                opts[k] = opt.state_dict()
        return {
            "optimizers": opts,
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
            "optimizer_steps": dict(self.steps),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_optimizers(self, state: dict[str, Any], reshard: Callable[[torch.optim.Optimizer], None] | None = None) -> None:
        """Restore the optimizer states, step counts and scaler of :meth:`state_dict`."""
        self.steps = defaultdict(int, state.get("optimizer_steps", {}))
        for k, s in state["optimizers"].items():
            if k in self.optimizers and "alias_of" not in s:
                self.optimizers[k].load_state_dict(s)
                if reshard is not None:
                    reshard(self.optimizers[k])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def load_schedulers(self, state: dict[str, Any]) -> None:
        """Restore the scheduler states of :meth:`state_dict`."""
        for k, s in state["schedulers"].items():
            if k in self.schedulers:
                self.schedulers[k].load_state_dict(s)
