"""The training loop: collect -> estimate -> update -> log, one method per phase.

One step reads top to bottom like CleanRL's ``ppo.py``::

    batch   = trainer.collect()          # many env copies, AEC loop, batched generation
    trainer.estimate(batch)              # the algorithm's estimator: advantages / returns / values
    metrics = trainer.update(batch)      # epochs x agents x minibatches, one guarded step per loss term
    trainer.log(metrics, batch)          # callbacks, history, metrics.jsonl / TensorBoard

The loop owns the phases; an algorithm (:class:`marft_algos.algorithm.Algorithm`) supplies
the parts: its estimator and its loss terms (``policy``, ``critic``, ``value``), each
stepping its own optimizer group of an :class:`marft_algos.optim.OptimizerSet`.
Everything a run does around the steps (transcripts, checkpoints, the learning-curve
plot, collapse recovery, self-play, fault injection) is a callback
(:mod:`marft_algos.callbacks`). An algorithm's trainer class only names its parts
(``config_cls = GRPOConfig``, ``algorithm_cls = GRPO``).

Register an algorithm with :func:`marft_algos.registry.register_algorithm`; the CLI finds it by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from marft_algos.algorithm import Algorithm
from marft_algos.async_rollout import AsyncRollout
from marft_algos.behaviour import Behaviour, temperature_of
from marft_algos.buffer import AgentBuffer, Minibatch, grouped_minibatch_indices
from marft_algos.callbacks import Callback, default_callbacks, env_fault
from marft_algos.checkpoint import check_parts, clean_stale
from marft_algos.config import PPOLossConfig, TrainConfig
from marft_algos.distributed import init_distributed, rank_seed
from marft_algos.dynamic_sampling import resample_groups
from marft_algos.fsdp import shard_optimizer_states
from marft_algos.length_stops import LengthStopWatch, mask_length_stops
from marft_algos.microbatch import micro_batch_rows
from marft_algos.optim import OptimizerSet, group_key, lr_factor, metric_prefix
from marft_algos.perf_stats import PerfStats
from marft_algos.policy_factory import (
    check_frozen_apart,
    check_policy,
    make_policy,
    policy_device,
    shard_policy,
)
from marft_algos.records import RolloutBatch, Transition
from marft_algos.rollout import RolloutCollector, default_env_fn, warn_overlong
from marft_algos.rundir import RunDirLock
from marft_algos.seeding import rng_state, seed_everything, set_rng_state
from marft_algos.threads import phase_threads

__all__ = ["Trainer"]

log = logging.getLogger("marft")


class Trainer:
    """The loop of every algorithm (see module docstring).

    Args:
        config: the algorithm's config dataclass.
        policy: a ready ``TeamPolicy`` (default: built from ``config.model`` / ``mode``).
        env_fn: builds one env copy (default: ``marft_envs.make(config.env_id, **config.env_kwargs)``).
        logger: a :class:`marft_algos.logging.MetricsLogger` (default: one in ``config.out_dir``).
        callbacks: extra :class:`~marft_algos.callbacks.Callback` s, run after the built-in ones.
        **parts: keyword arguments of the algorithm (e.g. ``value_model=``).

    Attributes:
        algorithm: the :class:`~marft_algos.algorithm.Algorithm` supplying estimator and losses.
        agents: the env's ``possible_agents`` (= policy roles).
        optim: the :class:`~marft_algos.optim.OptimizerSet` (``optimizers`` / ``schedulers`` by group).
        global_step: completed training steps; counters: cumulative counters; history: every step's metrics.
    """

    config_cls: ClassVar[type[TrainConfig]] = TrainConfig
    algorithm_cls: ClassVar[type[Algorithm]] = Algorithm
    #: a policy step whose loss is identically 0 (GRPO: every group scored alike, no KL or
    #: entropy term) skips its backward and steps AdamW on zero gradients, which is what the
    #: backward gives; False runs it
    skip_vanishing_updates: bool = True
    #: groups collected in the running step when train_step(num_groups=...) asked for a count
    _step_groups: int | None = None

    def __init__(
        self,
        config: TrainConfig,
        *,
        policy: Any = None,
        env_fn: Callable[[], Any] | None = None,
        logger: Any = None,
        callbacks: Sequence[Callback] = (),
        **parts: Any,
    ) -> None:
        if not isinstance(config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}")
        self.config = c = config
        # world size 1 without a launcher: no process group, every collective a no-op
        self.dist = init_distributed(c.distributed.backend, c.distributed.timeout_s)
        if c.release_freed_memory:
            from marft_algos.memory import pin_malloc_thresholds

            pin_malloc_thresholds()  # logs why when it cannot apply
        seed_everything(c.seed)
        self.algorithm = self.algorithm_cls(self, **parts)
        self.env_fn = env_fn or default_env_fn(c)
        self.collector = RolloutCollector(
            self.env_fn, None, num_envs=c.num_envs, group_size=self.algorithm.group_size, seed=c.seed, mode="train",
            sampling_overrides=c.sampling_overrides, max_context=c.max_context, strict_context=c.strict_context,
        )
        self.agents: list[str] = self.collector.possible_agents
        c.check_agents(self.agents)
        self.policy = policy if policy is not None else make_policy(c, self.agents)
        self.collector.policy = self.policy
        self.behaviour = Behaviour(self.policy)
        self.device = policy_device(self.policy, self.agents)
        self.global_step = 0
        self.counters: dict[str, float] = defaultdict(float)
        self.history: list[dict[str, float]] = []
        self.lr_scale = 1.0  # collapse recovery lowers every learning rate by this factor
        self.skip_update: set[str] = set()  # agents a callback leaves out of the update (self-play's opponent)
        # minibatch order has its own generator so that sampling noise elsewhere cannot shift it
        self.np_rng = np.random.default_rng(c.seed + 1)
        check_policy(c, self.policy, self.agents, reference=self.needs_reference())
        self.algorithm.setup()
        # FSDP2: shard after every adapter exists (the critic's too), before the optimizers
        self.sharding: Any = None
        if c.distributed.strategy == "fsdp" and self.dist.active:
            self.sharding = shard_policy(self.policy, self.dist, [p for a in self.trainable_agents() for p in self.policy.trainable_parameters(a)])
        self.optim = self.build_optimizers()
        self.algorithm.check()
        # every rank starts from rank 0's weights (value heads are initialised from each process's RNG)
        self.dist.broadcast_parameters(self.optim.parameters())
        if logger is None and c.out_dir and self.dist.is_main:
            from marft_algos.logging import MetricsLogger

            logger = MetricsLogger(c.out_dir, tensorboard=c.tensorboard)
        self.logger = logger
        self.fault = env_fault()  # the crash tests' pause points (None outside them)
        # rollout_workers > 0: batches come from worker processes (marft_algos.async_rollout)
        self.rollout = AsyncRollout(self) if c.rollout_workers else None
        self.callbacks: list[Callback] = default_callbacks(self.fault) + [PerfStats(), LengthStopWatch()] + self.algorithm.callbacks() + list(callbacks)
        if self.rollout is not None:
            self.callbacks.append(self.rollout)

    # ---- construction ------------------------------------------------------------------
    def trainable_agents(self) -> list[str]:
        """The agents whose policy is trained: all but ``config.frozen_agents``, in team order."""
        frozen = set(self.config.frozen_agents)
        return [a for a in self.agents if a not in frozen]

    def build_optimizers(self) -> OptimizerSet:
        """One AdamW per trained agent (agents sharing parameters share one), one per value
        group of the algorithm, and the schedulers; all at the current ``lr_scale``."""
        c = self.config
        scaler = None
        if getattr(self.policy, "compute_dtype", None) == torch.float16:  # fp16 gradients underflow unscaled
            scaler = torch.amp.GradScaler(self.device.type, init_scale=float(c.init_loss_scale))
        optim = OptimizerSet(max_grad_norm=c.max_grad_norm, dist=self.dist, counters=self.counters, scaler=scaler, sharding=self.sharding)
        check_frozen_apart(c, self.policy, self.agents, self.trainable_agents())
        for agent in self.trainable_agents():
            optim.add(agent, self.policy.trainable_parameters(agent), lr=c.agent_lr(agent) * self.lr_scale, weight_decay=c.weight_decay, eps=c.adam_eps)
        for key, (params, lr) in self.algorithm.param_groups().items():
            optim.add(key, params, lr=lr * self.lr_scale, eps=c.adam_eps)
        optim.add_schedules(lambda k: lr_factor(k, warmup=c.warmup_steps, total=c.steps, kind=c.lr_scheduler))
        if self.sharding is not None:
            for opt in optim.unique():
                self.sharding.check_homogeneous([p for g in opt.param_groups for p in g["params"]])
        return optim

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers by group name (:attr:`optim`)."""
        return self.optim.optimizers

    @property
    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LRScheduler]:
        """The schedulers by group name (:attr:`optim`)."""
        return self.optim.schedulers

    @property
    def optimizer_steps(self) -> dict[str, int]:
        """Optimizer steps taken per group."""
        return self.optim.steps

    def gathered(self, *, reference: bool = False) -> Any:
        """A block in which every rank holds the full policy weights and a forward issues no
        collective (FSDP; a no-op otherwise). Every no-grad forward outside the training
        minibatches runs inside one; all ranks enter it together."""
        return self.sharding.gathered(reference=reference) if self.sharding is not None else contextlib.nullcontext()

    def unsharded_state(self) -> Any:
        """A block in which weights and optimizer states are full tensors (FSDP checkpoints; a no-op otherwise)."""
        return self.sharding.full_state(self.optim.unique()) if self.sharding is not None else contextlib.nullcontext()

    def loading_weights(self) -> Any:
        """A block in which full weights load into sharded parameters (FSDP; a no-op otherwise)."""
        return self.sharding.loading() if self.sharding is not None else contextlib.nullcontext()

    def needs_reference(self) -> bool:
        """Reference log-probs are needed when the KL penalty to the reference is on."""
        return isinstance(self.config, PPOLossConfig) and self.config.beta > 0

    # ---- phase 1: collect ------------------------------------------------------------------
    def groups_this_step(self) -> int:
        """Groups of episodes the running step collects over all ranks: ``num_envs // group_size``,
        or the ``num_groups`` passed to :meth:`train_step`."""
        return self._step_groups or self.config.num_envs // self.algorithm.group_size

    def collect(self) -> RolloutBatch:
        """Play :meth:`groups_this_step` groups with the current policy (no gradients); with DAPO
        dynamic sampling (``config.dynamic_sampling``) groups without signal are replaced."""
        for cb in self.callbacks:
            cb.on_collect_start(self)
        if self.rollout is not None:  # from the workers: generated while the last update ran
            batch = self.rollout.next_batch()
        else:
            # each rank plays its slice of the one global problem list; FSDP: each rank decodes on
            # full local weights, no per-step collective
            with torch.no_grad(), self.gathered(), phase_threads("collect", self.config.collect_threads, self.device):
                batch = self.dist.collect(self.collector, self.groups_this_step())
                if getattr(self.config, "dynamic_sampling", False):
                    batch = resample_groups(batch, self.collector, self.dist, self.groups_this_step(), self.algorithm.no_signal, self.config.max_resample_tries)
        for cb in self.callbacks:
            cb.on_batch(self, batch)
        return batch

    # ---- phase 2: estimate -----------------------------------------------------------------
    def estimate(self, batch: RolloutBatch) -> None:
        """The algorithm's estimator fills advantages / returns / values (a critic gathers FSDP
        weights itself). With groups of episodes it logs ``train/frac_reward_zero_std``, the
        share of groups that carry no signal (TRL's name), and warns when no group does."""
        self.algorithm.estimate(batch)
        if self.config.mask_length_stops:
            batch.metrics["train/length_stops_masked"] = self.dist.sum([float(mask_length_stops(batch))])[0]
        if self.algorithm.group_size > 1:
            groups = list(batch.groups().values())
            flat = self.dist.sum([float(sum(self.algorithm.no_signal(g) for g in groups)), float(len(groups))])
            frac = flat[0] / flat[1] if flat[1] else 0.0
            batch.metrics["train/frac_reward_zero_std"] = frac
            if flat[1] and frac == 1.0:
                log.warning("step %d: every group's episodes scored alike: no learning signal in this step "
                            "(loss and gradients are 0; see train/frac_reward_zero_std)", self.global_step + 1)

    # ---- phase 3: update -------------------------------------------------------------------
    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """Epochs x agents x minibatches; each minibatch steps its value terms, then its policy
        term (policies only for the algorithm's :meth:`~marft_algos.algorithm.Algorithm.policy_agents`)."""
        c, d = self.config, self.dist
        present = {a for a in self.agents if batch.agent_transitions(a)}
        if d.active:  # several ranks: the same agents and minibatch counts everywhere (collectives pair up)
            present = {a for names in d.all_gather_object(sorted(present)) for a in names}
        policies = [a for a in self.algorithm.policy_agents(self.global_step, present) if a not in self.skip_update]
        learners = [a for a in self.agents if a in present] if self.algorithm.value_on_all_agents else policies
        self.optim.schedule(self.global_step)
        if policies:  # old (behaviour) / reference log-probs, before any step of this update
            with self.gathered(reference=self.needs_reference()):
                self.behaviour.fill(batch, self.agents, reference=self.needs_reference())
        samples = self.behaviour.kl_samples(batch, policies, getattr(c, "kl_sample", 0))
        t_kl = time.perf_counter()  # the diagnostics' own time: no-grad forwards beside the update (perf/kl_diagnostics_s)
        kl = self._kl_diagnostics(samples, reference=True)
        kl_s = time.perf_counter() - t_kl
        rng = np.random.default_rng(rank_seed(c.seed + 1, self.global_step, d.rank)) if d.active else self.np_rng
        self.buffers: dict[str, AgentBuffer] = {}
        sums: dict[str, list[float]] = defaultdict(list)
        for _epoch in range(c.ppo_epochs):
            for agent in learners:
                if agent not in self.buffers:  # padded tensors of the agent's actions; minibatches are index slices
                    self.buffers[agent] = AgentBuffer.from_transitions(agent, batch.agent_transitions(agent), batch.estimates)
                buffer = self.buffers[agent]
                keys = self.ratio_keys(buffer.transitions)
                units = len(set(keys)) if keys is not None else len(buffer)  # an action's segments stay in one minibatch
                n_mb = d.min_int(min(c.num_minibatches, units))  # 0: no data (on some rank)
                if not n_mb:
                    continue
                mbs = (buffer.minibatch(i) for i in grouped_minibatch_indices(keys, n_mb, rng)) if keys is not None else buffer.minibatches(n_mb, rng)
                for mb in mbs:
                    for k, v in self.train_minibatch(agent, mb, policy=agent in policies).items():
                        sums[k].append(v)
        out = {k: float(np.mean(v)) for k, v in sums.items()}
        out.update({f"agent/{a}/policy_updated": float(a in policies) for a in self.agents})
        out.update(kl)
        t_kl = time.perf_counter()
        out.update(self._kl_diagnostics(samples, reference=False))
        out["perf/kl_diagnostics_s"] = kl_s + time.perf_counter() - t_kl
        return out

    def _kl_diagnostics(self, samples: dict[str, Any], *, reference: bool) -> dict[str, float]:
        if reference and getattr(self.policy, "mode", None) == "full" and not self.needs_reference():  # no frozen copy
            return {}
        with self.gathered(reference=reference):
            return self.dist.mean_metrics(self.behaviour.kl_diagnostics(samples, self.agents, reference=reference))

    def train_minibatch(self, agent: str, mb: Minibatch, *, policy: bool = True) -> dict[str, float]:
        """One minibatch of ``agent``: each value term (whole minibatch), then with ``policy``
        the policy term (in micro-batches when ``micro_batch_tokens`` caps the forward), each
        one guarded optimizer step of its own group."""
        metrics: dict[str, float] = {}
        own, has_own = torch.zeros((), dtype=torch.float64), policy  # the agent's own terms (its policy, its value head)
        for term, (loss, m) in self.algorithm.value_losses(agent, mb).items():
            metrics.update(m)
            self._step(term, agent, loss, metrics, weight=self.algorithm.units(term, mb))
            if term != "critic":
                own, has_own = own + loss.detach().double().cpu(), True
        if policy:
            self.policy.set_train_role(agent)
            pieces = self.micro_batches(mb)
            # a loss identically 0 has a zero gradient: its forward gives the metrics, no backward
            zero = self.policy_term_vanishes(agent, mb)
            with torch.no_grad() if zero else contextlib.nullcontext():
                loss, m = self.policy_term(agent, mb) if len(pieces) == 1 else self.accumulate(agent, pieces, backward=not zero)
            metrics.update(m)
            metrics[f"agent/{agent}/backward_skipped"] = float(zero)
            cut = self.kl_cut(agent)
            snap = self.optim.snapshot(agent) if cut is not None else None
            if self._step("policy", agent, loss, metrics, weight=self.algorithm.units("policy", mb), accumulated=len(pieces) > 1, veto=cut, zero=zero) and cut is not None:
                # the trust region after the step: a step that moved the policy past the threshold is undone
                with torch.no_grad():
                    after = self.dist.mean_metrics(self.policy_term(agent, mb)[1], self.algorithm.units("policy", mb))
                metrics[f"agent/{agent}/step_kl"] = after[f"agent/{agent}/{self.algorithm.kl_cut_metric}"]
                if cut(after):
                    self.optim.restore(agent, snap)
                    metrics[f"agent/{agent}/kl_cut"] = 1.0
            own += loss.detach().double().cpu()
        self.optim.end_round()
        if has_own:
            metrics[f"agent/{agent}/loss"] = float(own)
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def policy_term_vanishes(self, agent: str, mb: Sequence[Transition]) -> bool:
        """Can ``agent``'s policy step on ``mb`` skip its backward, exactly? When
        :attr:`skip_vanishing_updates` is on and the algorithm knows the term is identically 0
        (:meth:`~marft_algos.algorithm.Algorithm.policy_term_vanishes`), except under FSDP
        (there the backward is a collective of all ranks)."""
        return self.skip_vanishing_updates and self.sharding is None and self.algorithm.policy_term_vanishes(mb)

    def policy_term(self, agent: str, mb: Sequence[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy's forward on ``mb`` and the algorithm's policy loss on it."""
        stats = self.policy.sequence_logprobs(  # no entropy bonus: the entropies are a metric, without a graph
            agent, [t.prompt_ids for t in mb], [t.response_ids for t in mb], temperature=temperature_of(mb),
            entropy_grad=getattr(self.config, "ent_coef", 0.0) > 0,
        )
        return self.algorithm.policy_loss(agent, mb, stats)

    def accumulate(self, agent: str, pieces: Sequence[Sequence[Transition]], *, backward: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward and backward of each piece, its loss scaled by its share of the minibatch's
        units, so the summed gradients are the whole minibatch's. Returns the detached total
        (non-finite if any piece's was: the step is then skipped) and share-weighted metrics.
        ``backward=False``: the forwards only (a loss identically 0)."""
        self.optim.zero_grad(group_key("policy", agent))
        weights = [self.algorithm.units("policy", p) for p in pieces]
        whole = sum(weights)
        total = torch.zeros((), dtype=torch.float64)
        sums: dict[str, float] = defaultdict(float)
        seen: dict[str, float] = defaultdict(float)
        for piece, w in zip(pieces, weights, strict=True):
            share = w / whole if whole > 0 else 1.0 / len(pieces)
            loss, metrics = self.policy_term(agent, piece)
            part = loss * share
            if backward and torch.isfinite(part.detach()).all():  # a non-finite piece skips the whole step
                self.optim.backward(part, whole)
            total += part.detach().double().cpu()
            for k, v in metrics.items():
                sums[k] += v * share
                seen[k] += share
        return total, {k: sums[k] / seen[k] for k in sums if seen[k] > 0}

    def _step(self, term: str, agent: str, loss: torch.Tensor, metrics: dict[str, float], *, zero: bool = False, **kw: Any) -> bool:
        key = group_key(term, agent)
        stepped, norm = self.optim.zero_gradient_step(key, agent, loss, metrics, **kw) if zero else self.optim.step(key, agent, loss, metrics, **kw)
        if norm is not None:
            metrics[f"{metric_prefix(key, agent)}/grad_norm"] = norm
        return stepped

    def kl_cut(self, agent: str) -> Callable[[dict[str, float]], bool] | None:
        """The KL hard cut of ``agent``'s policy step (``config.kl_threshold`` on the algorithm's
        :attr:`~marft_algos.algorithm.Algorithm.kl_cut_metric`), or None.

        It is checked twice: before the step, on the KL the minibatch's loss measured (moves
        with several epochs or minibatches, or a policy that moved since the rollout), and
        after it, on the KL of the updated policy on the same minibatch (``agent/<a>/step_kl``;
        a step past the threshold is undone: a trust region that also holds at one epoch and
        one minibatch, where the first is 0 by construction)."""
        th, name = getattr(self.config, "kl_threshold", None), self.algorithm.kl_cut_metric
        if th is None or name is None:
            return None

        def veto(metrics: dict[str, float]) -> bool:
            kl = metrics.get(f"agent/{agent}/{name}")
            cut = kl is not None and kl > th
            metrics[f"agent/{agent}/kl_cut"] = float(cut)
            if cut:
                self.counters["train/kl_cuts"] += 1
                self.counters[f"agent/{agent}/kl_cuts"] += 1
            return cut

        return veto

    def ratio_keys(self, transitions: Sequence[Transition]) -> list[Any] | None:
        """Each transition's action key under turn-level ratios (an action's segments share one
        ratio, so minibatches and micro-batches keep them together), else None."""
        return [t.action_key for t in transitions] if getattr(self.config, "importance_ratio", "token") == "turn" else None

    def micro_batches(self, mb: Minibatch) -> list[Any]:
        """``mb`` in pieces of at most ``micro_batch_tokens`` padded tokens (:mod:`marft_algos.microbatch`)."""
        cap = self.config.micro_batch_tokens
        if cap <= 0:
            return [mb]
        rows = micro_batch_rows([len(t.prompt_ids) + len(t.response_ids) for t in mb], cap, self.ratio_keys(mb))
        return [mb] if len(rows) <= 1 else [mb.subset(r) if isinstance(mb, Minibatch) else [mb[i] for i in r] for r in rows]

    # ---- one step and the run ------------------------------------------------------------------
    def train_step(self, num_groups: int | None = None) -> dict[str, float]:
        """One full step; returns its metrics (also logged and appended to ``history``).

        ``num_groups`` collects that many groups of episodes this step instead of
        ``num_envs // group_size`` (e.g. a smaller last step that fits a token budget); under a
        launcher it must be a multiple of the world size, as every rank plays an equal share.
        """
        if num_groups is not None and (isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1):
            raise ValueError(f"num_groups must be a positive int (groups of episodes to collect), got {num_groups!r}")
        if num_groups is not None and num_groups % self.dist.world_size:
            raise ValueError(f"num_groups={num_groups} does not split over {self.dist.world_size} ranks: pass a multiple of the world size")
        self._step_groups = num_groups
        try:
            t0 = time.perf_counter()
            if self.dist.active:  # each rank samples its own stream, the same one after a resume on any world size
                seed_everything(rank_seed(self.config.seed, self.global_step, self.dist.rank) % 2**32)
            batch = self.collect()
            batch.metrics = self.dist.mean_metrics(batch.metrics, len(batch.episodes))
            t1 = time.perf_counter()
            engine = getattr(self.policy, "engine", None)
            with phase_threads("update", self.config.update_threads, self.device):
                self.estimate(batch)
                if engine is not None:
                    engine.sleep()  # vLLM on CUDA: free its KV cache and weights for the update
                metrics = self.dist.mean_metrics(self.update(batch))
            if engine is not None:
                engine.wake_up()
                metrics.update(engine.metrics())  # e.g. the vllm engine's log-prob gap per role
            self.global_step += 1
            metrics.update({"perf/collect_s": t1 - t0, "perf/update_s": time.perf_counter() - t1, "perf/step_s": time.perf_counter() - t0})
            return self.log(metrics, batch)
        finally:
            self._step_groups = None

    def log(self, metrics: dict[str, float], batch: RolloutBatch) -> dict[str, float]:
        """Phase 4: the step's metrics (batch, update, counters, learning rates), the callbacks'
        ``on_step_end``, then ``history`` and the logger."""
        for key in ("rollout/verifier_timeouts", "rollout/overlong"):
            self.counters[key + "_total"] += batch.metrics.get(key, 0.0)
        for agent in self.agents:  # per agent, for the end-of-run summary
            if batch.metrics.get(f"agent/{agent}/overlong"):
                self.counters[f"agent/{agent}/overlong_total"] += batch.metrics[f"agent/{agent}/overlong"]
        out: dict[str, float] = {"train/step": float(self.global_step), **batch.metrics, **metrics}
        out.update({k: float(v) for k, v in self.counters.items()})
        if self.optim.scaler is not None:
            out["train/loss_scale"] = float(self.optim.scaler.get_scale())
        out.update({f"agent/{a}/lr": float(self.schedulers[a].get_last_lr()[0]) for a in self.agents if a in self.schedulers})
        for cb in self.callbacks:
            cb.on_step_end(self, out, batch)
        self.history.append(out)
        if self.logger is not None and self.global_step % self.config.log_every == 0:
            self.logger.log(self.global_step, out)
        self.last_batch = batch
        return out

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Train until ``global_step == steps`` (default ``config.steps``) or ``max_minutes``.

        With an ``out_dir`` the run dir is locked for the duration (by rank 0 under a
        launcher; :class:`marft_algos.rundir.RunDirLock`): a second run on it stops with an error.
        """
        c = self.config
        target = c.steps if steps is None else steps
        lock = None
        if c.out_dir and self.dist.is_main:  # re-entrant: the CLI may hold it already
            lock = RunDirLock(c.out_dir).acquire()
            clean_stale(Path(c.out_dir) / "checkpoints")
        bar = tqdm(total=target, initial=self.global_step, disable=not (c.progress and self.dist.is_main), desc=type(self).__name__, dynamic_ncols=True)
        new: list[dict[str, float]] = []
        start = time.time()
        try:
            for cb in self.callbacks:
                cb.on_train_start(self)
            while self.global_step < target:
                if c.max_minutes is not None and self.dist.any(time.time() - start > 60 * c.max_minutes):
                    bar.write(f"time budget of {c.max_minutes} min reached after {self.global_step} steps")
                    break
                m = self.train_step()
                new.append(m)
                if c.max_minutes is not None:  # a time budget ends the run: the bar's total (and ETA) follows it
                    elapsed = time.time() - start
                    left = max(0.0, 60 * c.max_minutes - elapsed)
                    bar.total = min(target, self.global_step + math.ceil(left * len(new) / max(elapsed, 1e-9)))
                bar.update(1)
                bar.set_postfix(team_reward=f"{m.get('team/reward', float('nan')):.3f}", step_s=f"{m['perf/step_s']:.1f}")
                for cb in self.callbacks:
                    cb.on_run_step(self, m)
            bar.close()
            warn_overlong(self.counters, self.history, c.max_context)
            for cb in self.callbacks:
                cb.on_train_end(self)
            if self.logger is not None:
                self.logger.flush()
            return new
        finally:
            bar.close()
            for cb in self.callbacks:
                cb.close(self)
            if lock is not None:
                lock.release()

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy weights (saved by ``policy.save``): progress, optimizer
        groups, RNGs, the problem stream, the value model, and each callback's state."""
        state = {
            "algo": self.config.algo,
            "global_step": self.global_step,
            "counters": dict(self.counters),
            "history": self.history,
            "lr_scale": self.lr_scale,
            "rng": rng_state(),
            "np_rng": self.np_rng.bit_generator.state,
            "collector": self.collector.state_dict(),
            "value_model": self.algorithm.state_dict(),
            **self.optim.state_dict(),
        }
        state.update({cb.state_key: cb.state_dict() for cb in self.callbacks if cb.state_key})
        return state

    def load_state_dict(self, state: dict[str, Any], parts: Collection[str] | None = None) -> None:
        """Restore :meth:`state_dict`, or only the named :data:`~marft_algos.checkpoint.CHECKPOINT_PARTS`
        (policy weights are loaded separately, by ``policy.load``)."""
        chosen = check_parts(parts)
        if "weights" in chosen:
            self.algorithm.load_state_dict(state["value_model"])
        if "progress" in chosen:
            self.global_step = int(state["global_step"])
            self.counters = self.optim.counters = defaultdict(float, state.get("counters", {}))
            self.history = list(state.get("history", []))
        for cb in self.callbacks:
            if cb.state_key and (cb.state_key in state or "progress" in chosen):
                cb.load_state_dict(state.get(cb.state_key), chosen)
        if "optimizers" in chosen:
            self.optim.load_optimizers(state, shard_optimizer_states if self.sharding is not None else None)
        if "schedulers" in chosen:
            self.optim.load_schedulers(state)
            self.lr_scale = float(state.get("lr_scale", 1.0))
        if "data" in chosen:
            self.collector.load_state_dict(state["collector"])
        if "rng" in chosen:
            self.np_rng.bit_generator.state = state["np_rng"]
            set_rng_state(state["rng"])

    def save_checkpoint(self, root: str | Path | None = None) -> Path:
        """Atomic checkpoint under ``<out_dir>/checkpoints`` (see :mod:`marft_algos.checkpoint`)."""
        from marft_algos.checkpoint import save_checkpoint

        root = Path(root) if root is not None else Path(self.config.out_dir or ".") / "checkpoints"
        with self.unsharded_state():  # FSDP: every rank gathers the full weights, rank 0 writes them
            if not self.dist.is_main:  # every rank holds the same state: rank 0 writes it
                self.dist.barrier()
                return root / f"step-{self.global_step:08d}"
            path = save_checkpoint(self, root, keep=self.config.keep_checkpoints)
            self.dist.barrier()
            return path

    def load_checkpoint(self, path: str | Path, parts: Collection[str] | None = None, *, check_config: bool = True) -> Path:
        """Restore from a checkpoint dir, a ``checkpoints`` root, or a run dir (newest complete one).

        ``parts``: only these :data:`~marft_algos.checkpoint.CHECKPOINT_PARTS` (default all).
        A full resume with ``check_config`` compares the checkpoint's settings with this
        trainer's first (:func:`marft_algos.rundir.resume_changes`): settings that cannot change
        on resume raise :class:`~marft_algos.rundir.ResumeConfigError` before anything is
        loaded; other changes apply and are listed in ``self.resume_changes``. A checkpoint
        whose files fail to load raises :class:`~marft_algos.checkpoint.CheckpointError`.
        """
        from marft_algos.checkpoint import (
            CheckpointError,
            find_checkpoint,
            load_checkpoint,
            read_checkpoint_config,
        )
        from marft_algos.rundir import apply_optimizer_settings, resume_changes

        check_parts(parts)  # a wrong part name is the caller's error, not a damaged checkpoint
        ckpt = find_checkpoint(path)
        saved: dict[str, Any] | None = None
        if check_config and parts is None:
            saved = read_checkpoint_config(ckpt)
            manifest = json.loads((ckpt / "MANIFEST.json").read_text(encoding="utf-8"))
            self.resume_changes = resume_changes(
                saved, self.config, saved_agents=manifest.get("agents"), agents=list(self.agents), where=ckpt
            ).applied
        try:
            loaded = load_checkpoint(self, ckpt, parts=parts)
        except (CheckpointError, OSError):
            raise
        except Exception as e:  # a file that verifies but does not load (written by another version?)
            raise CheckpointError(f"{ckpt}: cannot load it ({type(e).__name__}: {e})") from e
        if saved is not None and (parts is None or "optimizers" in parts):
            apply_optimizer_settings(self, saved)
        return loaded

