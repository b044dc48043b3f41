"""The trainer interface every algorithm implements, and the algorithm registry.

One training step reads like the papers::

    batch   = trainer.collect()              # many env copies, AEC loop, batched generation
    trainer.compute_advantages(batch)        # fills Transition.advantage / returns / value (+ batch.estimates)
    metrics = trainer.update(batch)          # PPO-style epochs x agents x minibatches

Algorithms differ only in :meth:`Trainer.compute_advantages` and the losses
(:meth:`Trainer.policy_loss`, :meth:`Trainer.extra_losses`). Everything else (rollouts,
per-agent optimizers and schedulers, the NaN/inf guard, logging, checkpoints) lives
here and is shared.

Extension points for subclasses (e.g. action-/token-level MARFT with a critic):

- :meth:`setup` builds extra modules (critic, value heads) after the policy exists.
- :meth:`build_optimizers` / :meth:`build_schedulers` return dicts keyed by name
  (policy optimizers are keyed by agent; internal ones take a key in the reserved
  ``__`` namespace, e.g. :data:`CRITIC_KEY`, so that no role can collide with them).
- :meth:`optimizer_keys` says which optimizers one agent's minibatch steps
  (default: that agent's; IPPO adds :func:`value_key` of the agent).
- :meth:`update_agents` says which agents update at this step and in which order
  (agent-by-agent schedules override it).
- :meth:`prepare_update` runs once per batch before the epochs (old / reference
  log-probs); :meth:`before_optimizer_step` may veto a step (KL hard cut).
- :meth:`state_dict` / :meth:`load_state_dict`: extend with ``super()`` to checkpoint
  extra state (critic weights, value heads, ...).

Register an algorithm with :func:`marft_algos.registry.register_algorithm`; the CLI
finds it by name (the registry and the seeding helpers used to live here and are still
importable from this module).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from marft_algos.buffer import AgentBuffer, Minibatch, action_field, token_field
from marft_algos.config import ConfigError, PPOLossConfig, TrainConfig
from marft_algos.distributed import init_distributed, minibatch_weight, rank_seed
from marft_algos.fsdp import full_grad_norm, is_sharded, shard_optimizer_states
from marft_algos.microbatch import micro_batch_rows
from marft_algos.registry import *  # noqa: F403  (the registry's names, importable from here as before)
from marft_algos.registry import lazy_exports, list_algorithms
from marft_algos.rollout import (
    RolloutBatch,
    RolloutCollector,
    Transition,
    grouped_minibatch_indices,
)
from marft_algos.seeding import rng_state, seed_everything, set_rng_state

# (the registry's and the seeding helpers' names are still importable from here; their
# home and their __all__ are marft_algos.registry and marft_algos.seeding)
__all__ = [
    "Trainer",
    "CRITIC_KEY",
    "value_key",
    "pad_sequences",
    "make_policy",
]


#: Prefix of every internal optimizer/scheduler key (the critic's, IPPO's value heads): policy
#: optimizers are keyed by role, and roles may not start with it (see TrainConfig.check_agents),
#: so a role named "critic" or "value" never shares a key with the value model.
INTERNAL_KEY_PREFIX = "__"
#: The MARFT critic's optimizer/scheduler key.
CRITIC_KEY = "__critic__"


def value_key(agent: str) -> str:
    """IPPO's optimizer key of ``agent``'s value head (internal namespace, never a role)."""
    return f"__value__/{agent}"


def metric_prefix(key: str, agent: str) -> str:
    """Metric namespace of optimizer ``key`` stepped on ``agent``'s minibatch:
    ``agent/<agent>`` for its policy, ``critic`` / ``value/<agent>`` for internal ones."""
    if key == agent:
        return f"agent/{agent}"
    return key.replace("__", "") if key.startswith(INTERNAL_KEY_PREFIX) else key


# Keys older checkpoints used for the internal optimizers.
_LEGACY_KEYS = {"critic": CRITIC_KEY}


def _discover() -> None:
    """Import every registered algorithm (kept for scripts written against the old registry)."""
    list_algorithms()



# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def pad_sequences(seqs: Sequence[Sequence[float]], length: int, value: float = 0.0, device: Any = None) -> torch.Tensor:
    """Right-pad float sequences to ``length`` (extra elements are cut) -> [B, length]."""
    out = torch.full((len(seqs), length), value, dtype=torch.float32, device=device)
    for i, s in enumerate(seqs):
        n = min(len(s), length)
        if n:
            out[i, :n] = torch.as_tensor(list(s[:n]), dtype=torch.float32, device=device)
    return out


def _lr_lambda(warmup: int, total: int, kind: str) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if kind == "linear" and total > warmup:
            return max(0.0, 1.0 - (step - warmup) / (total - warmup))
        return 1.0

    return f


def make_policy(config: TrainConfig, agents: Sequence[str]) -> Any:
    """Build a ``TeamPolicy`` for ``agents`` from a config (model, mode, LoRA, device, dtype)."""
    from marft_algos.models import LoraSettings, TeamPolicy

    base: Any = config.model
    if config.model_per_agent:
        base = {a: config.model_per_agent.get(a, config.model) for a in agents}
    lora = LoraSettings(r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout)
    kwargs: dict[str, Any] = {"base": base, "mode": config.mode, "lora": lora}
    if config.device != "auto":
        kwargs["device"] = config.device
    if config.dtype is not None:
        kwargs["dtype"] = config.dtype
    if config.activation_checkpointing:
        kwargs["activation_checkpointing"] = True
    policy = TeamPolicy(list(agents), **kwargs)
    if config.engine != "hf" or config.engine_options:  # the policy starts on the built-in engine
        from marft_algos.engines import get_engine

        policy.engine = get_engine(config.engine)(policy, **config.engine_options)
    return policy


# --------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------


class Trainer(ABC):
    """Base class: collect -> compute_advantages -> update, with shared machinery.

    Args:
        config: the algorithm's config dataclass.
        policy: a ready ``TeamPolicy`` (default: built from ``config.model`` / ``mode``).
        env_fn: builds one env copy (default: ``marft_envs.make(config.env_id, **config.env_kwargs)``).
        logger: a :class:`marft_algos.logging.MetricsLogger` (default: one in
            ``config.out_dir`` if set, else metrics are only kept in ``self.history``).

    Attributes:
        agents: the env's ``possible_agents`` (= policy roles).
        optimizers / schedulers: dicts keyed by name (an agent, or an internal key such as :data:`CRITIC_KEY`).
        global_step: completed training steps.
        counters: cumulative counters (``train/nonfinite_skips``, ``rollout/verifier_timeouts``, ...).
        history: the metrics dict of every step.
    """

    config_cls: ClassVar[type[TrainConfig]] = TrainConfig
    #: group size used by the collector (GRPO: config.group_size)
    group_size: int = 1
    #: groups collected in the running step when train_step(num_groups=...) asked for a count
    _step_groups: int | None = None

    def __init__(
        self,
        config: TrainConfig,
        *,
        policy: Any = None,
        env_fn: Callable[[], Any] | None = None,
        logger: Any = None,
    ) -> None:
        if not isinstance(config, self.config_cls):
            raise TypeError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}")
        self.config = config
        # world size 1 without a launcher: no process group, every collective a no-op
        self.dist = init_distributed(config.distributed.backend, config.distributed.timeout_s)
        self._dist_weight = 1.0
        if config.release_freed_memory:
            from marft_algos.memory import pin_malloc_thresholds

            pin_malloc_thresholds()  # logs why when it cannot apply
        seed_everything(config.seed)
        self.env_fn = env_fn or self.default_env_fn(config)
        self.collector = self.build_collector(self.env_fn)
        self.agents: list[str] = self.collector.possible_agents
        config.check_agents(self.agents)
        self.policy = policy if policy is not None else self.build_policy()
        self.collector.policy = self.policy
        self.device = self._policy_device()
        self.global_step = 0
        self.optimizer_steps: dict[str, int] = defaultdict(int)
        self.counters: dict[str, float] = defaultdict(float)
        self.history: list[dict[str, float]] = []
        # Minibatch order has its own generator so that sampling noise elsewhere cannot shift it.
        self.np_rng = np.random.default_rng(config.seed + 1)
        self.check_policy()
        self.setup()
        # FSDP2: shard after every adapter exists (the critic's too), before the optimizers
        self.sharding: Any = self.build_sharding() if config.distributed.strategy == "fsdp" and self.dist.active else None
        self.optimizers = self.build_optimizers()
        self.schedulers = self.build_schedulers()
        self.scaler = self.build_scaler()
        if self.sharding is not None:
            for opt in self.optimizers.values():
                self.sharding.check_homogeneous([p for g in opt.param_groups for p in g["params"]])
        # every rank starts from rank 0's weights (value heads are initialised from each process's RNG;
        # sharded parameters were broadcast before they were split)
        self.dist.broadcast_parameters(p for opt in {id(o): o for o in self.optimizers.values()}.values() for g in opt.param_groups for p in g["params"])
        if logger is None and config.out_dir and self.dist.is_main:
            from marft_algos.logging import MetricsLogger

            logger = MetricsLogger(config.out_dir, tensorboard=config.tensorboard)
        self.logger = logger
        self._start_time = time.time()

    # ---- construction hooks ------------------------------------------------------
    @staticmethod
    def default_env_fn(config: TrainConfig) -> Callable[[], Any]:
        """A factory of env copies: ``marft_envs.make(config.env_id, **config.env_kwargs)``."""
        import marft_envs

        env_id, kwargs = config.env_id, dict(config.env_kwargs)
        return lambda: marft_envs.make(env_id, **kwargs)

    def build_collector(self, env_fn: Callable[[], Any]) -> RolloutCollector:
        """The rollout collector over ``config.num_envs`` env copies (groups of ``group_size``)."""
        c = self.config
        return RolloutCollector(
            env_fn,
            None,
            num_envs=c.num_envs,
            group_size=self.group_size,
            seed=c.seed,
            mode="train",
            sampling_overrides=c.sampling_overrides,
            max_context=c.max_context,
            strict_context=c.strict_context,
        )

    def build_policy(self) -> Any:
        """The team policy from ``config.model`` / ``mode`` / LoRA settings (see :func:`make_policy`)."""
        return make_policy(self.config, self.agents)

    def _policy_device(self) -> torch.device:
        dev = getattr(self.policy, "device", None)
        if dev is not None:
            return torch.device(dev)
        for role in self.agents:
            for p in self.policy.trainable_parameters(role):
                return p.device
        return torch.device("cpu")

    def check_policy(self) -> None:
        """Reject a policy that cannot serve this config (raises :class:`ConfigError`)."""
        from marft_algos.config import ConfigError

        if self.needs_reference() and getattr(self.policy, "mode", None) == "full":
            bases = getattr(self.policy, "_base", None)
            if bases is not None and any(bases(a).reference is None for a in self.agents):
                raise ConfigError(
                    "beta > 0 with mode='full' needs the frozen reference copy of the base (TeamPolicy(full_reference=True), "
                    "the default of make_policy)"
                )

    def build_sharding(self) -> Any:
        """FSDP2 over the policy (``distributed.strategy="fsdp"`` under a launcher): a
        :class:`marft_algos.fsdp.PolicySharding`, built after :meth:`setup` and before the optimizers."""
        from marft_algos.fsdp import PolicySharding

        bases = getattr(self.policy, "loaded_bases", None)
        if bases is None or len(bases) != 1:
            raise ConfigError(
                "distributed.strategy='fsdp' shards a TeamPolicy with one base model; this policy has "
                f"{'no loaded bases' if bases is None else f'{len(bases)} bases'}: use distributed.strategy='ddp'"
            )
        # every rank starts from rank 0's weights: broadcast them while they are still whole
        trained = {id(p): p for a in self.trainable_agents() for p in self.policy.trainable_parameters(a)}
        self.dist.broadcast_parameters(trained.values())
        return PolicySharding(self.policy, self.dist)

    def gathered(self, *, reference: bool = False) -> Any:
        """A block in which every rank holds the full policy weights and a forward issues no
        collective (FSDP: rollouts and no-grad scoring; see :mod:`marft_algos.fsdp`); a no-op
        without sharding. ``reference``: the frozen reference copy too (full fine-tuning).

        Every no-grad forward outside the training minibatches runs inside one: the trainer
        wraps the rollouts and :meth:`prepare_update`; a :meth:`compute_advantages` that runs a
        model (a critic's values) wraps that part itself. All ranks enter it together."""
        if self.sharding is None:
            return contextlib.nullcontext()
        return self.sharding.gathered(reference=reference)

    def unsharded_state(self) -> Any:
        """A block in which the policy weights and optimizer states are full tensors, for a
        checkpoint in the single-process format (FSDP: every rank enters it; a no-op otherwise)."""
        if self.sharding is None:
            return contextlib.nullcontext()
        return self.sharding.full_state(list(self.optimizers.values()))

    def loading_weights(self) -> Any:
        """A block in which full weights load into sharded parameters (FSDP; a no-op otherwise)."""
        if self.sharding is None:
            return contextlib.nullcontext()
        return self.sharding.loading()

    def setup(self) -> None:  # noqa: B027  (optional hook)
        """Hook: build extra modules (value heads, critic) before optimizers are built."""

    def build_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """One AdamW per agent over that agent's trainable parameters (none for frozen agents).

        Agents that share parameters (mode="shared") share one optimizer object.
        """
        c = self.config
        optimizers: dict[str, torch.optim.Optimizer] = {}
        by_params: dict[tuple[int, ...], torch.optim.Optimizer] = {}
        self.check_frozen_apart()
        for agent in self.trainable_agents():
            params = list(self.policy.trainable_parameters(agent))
            if not params:
                raise RuntimeError(f"agent {agent!r} has no trainable parameters")
            key = tuple(sorted(id(p) for p in params))
            if key not in by_params:
                by_params[key] = torch.optim.AdamW(params, lr=c.agent_lr(agent), weight_decay=c.weight_decay, eps=c.adam_eps)
            optimizers[agent] = by_params[key]
        return optimizers

    def trainable_agents(self) -> list[str]:
        """The agents whose policy is trained: all but ``config.frozen_agents``, in team order."""
        frozen = set(self.config.frozen_agents)
        return [a for a in self.agents if a not in frozen]

    def check_frozen_apart(self) -> None:
        """A frozen agent must not share parameters with a trained one (mode="shared", one
        adapter named by two profiles): the trained agent's steps would move it too."""
        frozen = [a for a in self.agents if a in set(self.config.frozen_agents)]
        if not frozen:
            return
        trained = {id(p) for a in self.trainable_agents() for p in self.policy.trainable_parameters(a)}
        shared = [a for a in frozen if any(id(p) in trained for p in self.policy.trainable_parameters(a))]
        if shared:
            raise ConfigError(
                f"frozen_agents {shared} share their parameters with trained agents (mode={self.config.mode!r} or "
                "profiles naming one adapter): give each agent its own adapter (mode='lora') to freeze some of them"
            )

    def build_schedulers(self) -> dict[str, torch.optim.lr_scheduler.LRScheduler]:
        """One LambdaLR (warm-up, then constant or linear decay) per distinct optimizer."""
        c = self.config
        total = max(1, c.steps * c.ppo_epochs * c.num_minibatches)
        out: dict[str, torch.optim.lr_scheduler.LRScheduler] = {}
        made: dict[int, torch.optim.lr_scheduler.LRScheduler] = {}
        for name, opt in self.optimizers.items():
            if id(opt) not in made:
                made[id(opt)] = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(c.warmup_steps, total, c.lr_scheduler))
            out[name] = made[id(opt)]
        return out

    # ---- the three phases --------------------------------------------------------
    def groups_this_step(self) -> int:
        """Groups of episodes the running step collects, over all ranks: ``num_envs // group_size``,
        or the ``num_groups`` passed to :meth:`train_step`."""
        return self._step_groups or self.config.num_envs // self.group_size

    def collect(self) -> RolloutBatch:
        """Play :meth:`groups_this_step` groups of episodes with the current policy (no gradients)."""
        with torch.no_grad():  # each rank plays its slice of the one global problem list
            return self.dist.collect(self.collector, self.groups_this_step())

    @abstractmethod
    def compute_advantages(self, batch: RolloutBatch) -> None:
        """Fill ``advantage`` (and ``returns`` / ``value`` where used) of every trainable transition;
        anything else an estimator computes per action goes to the typed ``batch.estimates``
        (:mod:`marft_algos.estimates`), never into ``Transition.extras``."""

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """PPO-style update: epochs x agents x minibatches; returns averaged metrics."""
        c = self.config
        sums: dict[str, list[float]] = defaultdict(list)
        with self.gathered(reference=self.needs_reference()):  # no-grad forwards, as many as each rank needs
            self.prepare_update(batch)
        d = self.dist  # several ranks: the same agents and minibatch counts everywhere (collectives pair up)
        rng = np.random.default_rng(rank_seed(c.seed + 1, self.global_step, d.rank)) if d.active else self.np_rng
        agents = self.update_agents(batch)
        if d.active:
            present = {a for names in d.all_gather_object(agents) for a in names}
            agents = [a for a in self.agents if a in present]
        # one buffer of padded tensors per agent; minibatches are index slices of it
        self.buffers: dict[str, AgentBuffer] = {}
        for epoch in range(c.ppo_epochs):
            for agent in agents:
                if agent not in self.buffers:
                    self.buffers[agent] = self.build_buffer(agent, batch)
                buffer = self.buffers[agent]
                keys = self.ratio_groups(buffer.transitions)
                units = len(set(keys)) if keys is not None else len(buffer)  # an action's segments stay in one minibatch
                n_mb = d.min_int(min(c.num_minibatches, units))  # 0: no data (on some rank)
                if not n_mb:
                    continue
                if keys is not None:
                    mbs = (buffer.minibatch(i) for i in grouped_minibatch_indices(keys, n_mb, rng))
                else:
                    mbs = buffer.minibatches(n_mb, rng)
                for mb in mbs:
                    self._dist_weight = minibatch_weight(self, mb)
                    for k, v in self.train_minibatch(agent, mb, epoch=epoch).items():
                        sums[k].append(v)
        self.after_update(batch)
        return {k: float(np.mean(v)) for k, v in sums.items()}

    # ---- update internals (overridable) --------------------------------------------
    def build_buffer(self, agent: str, batch: RolloutBatch) -> AgentBuffer:
        """``agent``'s trainable actions of ``batch`` and their estimates as padded tensors
        (after :meth:`prepare_update`)."""
        return AgentBuffer.from_transitions(agent, batch.agent_transitions(agent), batch.estimates)

    def update_agents(self, batch: RolloutBatch) -> list[str]:
        """Agents updated at this step, in order (default: all trained agents with data)."""
        present = set(batch.agents)
        return [a for a in self.trainable_agents() if a in present]

    def optimizer_keys(self, agent: str) -> list[str]:
        """Optimizers stepped by one minibatch of ``agent`` (extend for value heads / critic)."""
        return [agent]

    def sampler_logprobs_exact(self) -> bool:
        """Can the sampler's log-probs serve as the old (behaviour) log-probs?

        Yes when the policy computes in fp32: the KV-cached decode and the training forward
        then agree to ~3e-6 per token (measured on the tiny model, mixed-adapter batches).
        Under bf16/fp16 autocast they differ by up to ~2e-2 per token, which would
        put rounding noise into every ratio and KL: those runs recompute the old log-probs
        with the training forward instead (one no-grad pass per step).
        """
        if self.engine_logprobs_kept():
            return False  # the engine's own numbers: recompute, and correct with truncated IS
        pol = self.policy
        dtype = getattr(pol, "compute_dtype", None)
        device = getattr(pol, "device", None)
        if dtype is None or device is None:
            return False  # an unknown policy: recompute, which is always consistent
        return dtype == torch.float32

    def engine_logprobs_kept(self) -> bool:
        """Did the rollout engine keep its own log-probs (``logprob_source="engine"``), which
        differ from the trainer's forward? Then :meth:`prepare_update` recomputes the old
        log-probs and the policy loss applies :meth:`tis_weights`."""
        engine = getattr(self.policy, "engine", None)
        return engine is not None and not getattr(engine, "logprobs_exact", True)

    def engine_logprobs(self, mb: list[Transition], stats: Any) -> torch.Tensor | None:
        """The engine's log-probs of the sampled tokens ``[B, T]`` when it kept its own
        (:meth:`engine_logprobs_kept`), else None (no correction needed)."""
        if not self.engine_logprobs_kept():
            return None
        lp = token_field(mb, "sampler_logp", stats.logprobs.shape[1], stats.logprobs.device)
        if lp is None:
            raise RuntimeError("the engine kept its own log-probs, but some actions of this minibatch have none "
                               "(one per sampled token): truncated importance sampling cannot weight them")
        return lp

    def tis_weights(self, agent: str, mb: list[Transition], stats: Any, old_logp: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor | None:
        """Truncated importance-sampling weights ``min(exp(old - engine), tis_cap)`` per token
        (detached; :func:`marft_algos.losses.truncated_is_weights`) when the engine kept its own
        log-probs, else None. Logs ``agent/<a>/engine_logp_gap`` (mean ``|old - engine|``)
        and ``agent/<a>/tis_clipped_frac``."""
        from marft_algos import losses

        engine = self.engine_logprobs(mb, stats)
        if engine is None:
            return None
        weights, info = losses.truncated_is_weights(old_logp, engine, stats.mask, self.ppo_config().tis_cap)
        metrics.update({f"agent/{agent}/{k}": float(v) for k, v in info.items()})
        return weights

    def needs_reference(self) -> bool:
        """Reference log-probs are needed when the KL penalty to the reference is on."""
        return isinstance(self.config, PPOLossConfig) and self.config.beta > 0

    def prepare_update(self, batch: RolloutBatch, chunk: int = 16) -> None:
        """Old (behaviour) and reference log-probs of every trainable action, before any update.

        Old log-probs are those of the policy that SAMPLED the actions: the sampler's own
        log-probs (same tokens, same context, same temperature; see
        :meth:`sampler_logprobs_exact`) or, under reduced-precision autocast, a no-grad
        recomputation done here, before the first optimizer step of this update. Either way
        the ratio measures how far the policy moved since the rollout: at the defaults
        (one epoch, one minibatch) it is 1 for an agent whose own adapter has not stepped
        yet, but not for the second agent of a shared adapter (``mode="shared"``/``"full"``),
        whose parameters the first agent's step already moved, nor when anything changed
        the policy between rollout and update; the KL cut and the KL-spike detector see it.
        Both go to ``batch.estimates`` (``old_logp``, ``ref_logp``); an action whose
        ``old_logp`` is already there keeps it.
        """
        use_sampler = self.sampler_logprobs_exact()
        need_ref = self.needs_reference()
        est = batch.estimates
        with torch.no_grad():
            for agent in self.agents:
                trs = batch.agent_transitions(agent)
                todo: list[Transition] = []
                for t in trs:
                    if est[t].old_logp is not None:
                        continue
                    if use_sampler and len(t.old_logprobs) == len(t.response_ids):
                        est[t].old_logp = [float(x) for x in t.old_logprobs]
                    else:
                        todo.append(t)
                if todo:
                    self.policy.set_train_role(agent)
                    for s in range(0, len(todo), chunk):
                        part = todo[s : s + chunk]
                        stats = self.policy.sequence_logprobs(
                            agent, [t.prompt_ids for t in part], [t.response_ids for t in part], temperature=self.temperature_of(part)
                        )
                        for t, lp, m in zip(part, stats.logprobs, stats.mask, strict=True):
                            est[t].old_logp = lp[m.bool()].float().cpu().tolist()
                if not need_ref:
                    continue
                for s in range(0, len(trs), chunk):
                    part = trs[s : s + chunk]
                    ref = self.policy.sequence_logprobs(
                        agent, [t.prompt_ids for t in part], [t.response_ids for t in part], temperature=self.temperature_of(part), reference=True
                    )
                    for t, lp, m in zip(part, ref.logprobs, ref.mask, strict=True):
                        est[t].ref_logp = lp[m.bool()].float().cpu().tolist()

    @staticmethod
    def temperature_of(transitions: Sequence[Transition]) -> float:
        """The sampling temperature of a minibatch (one agent's actions share their settings)."""
        temps = {t.temperature for t in transitions}
        if len(temps) > 1:
            raise ValueError(f"a minibatch mixes sampling temperatures {sorted(temps)}")
        return temps.pop() if temps else 1.0

    def train_minibatch(self, agent: str, mb: list[Transition], *, epoch: int = 0) -> dict[str, float]:
        """Loss on one minibatch of ``agent``'s transitions and one guarded optimizer step
        (the forward and backward in micro-batches when ``micro_batch_tokens`` caps them)."""
        self.policy.set_train_role(agent)
        pieces = self.micro_batches(mb)
        if len(pieces) == 1:
            total, metrics = self.minibatch_loss(agent, mb)
            ok, grad_norms = self.optimizer_step(agent, total, metrics)
        else:
            total, metrics = self.accumulate_gradients(agent, pieces)
            ok, grad_norms = self.optimizer_step(agent, total, metrics, accumulated=True)
        for name, gn in grad_norms.items():
            metrics[f"{metric_prefix(name, agent)}/grad_norm"] = gn
        metrics[f"agent/{agent}/loss"] = float(total.detach()) if torch.isfinite(total.detach()) else float("nan")
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def minibatch_loss(self, agent: str, mb: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy loss plus the extra losses of ``agent`` on ``mb`` (one forward), and their metrics."""
        stats = self.policy.sequence_logprobs(  # no entropy bonus: the entropies are a metric, without a graph
            agent, [t.prompt_ids for t in mb], [t.response_ids for t in mb], temperature=self.temperature_of(mb),
            entropy_grad=getattr(self.config, "ent_coef", 0.0) > 0,
        )
        loss, metrics = self.policy_loss(agent, mb, stats)
        extra, extra_metrics = self.extra_losses(agent, mb, stats)
        metrics.update(extra_metrics)
        return (loss + extra if extra is not None else loss), metrics

    def ratio_groups(self, transitions: Sequence[Transition]) -> list[Any] | None:
        """Each transition's action key under turn-level ratios (an action's segments share one
        ratio, so minibatches and micro-batches keep them together), else None."""
        if getattr(self.config, "importance_ratio", "token") != "turn":
            return None
        return [t.action_key for t in transitions]

    def micro_batches(self, mb: list[Transition]) -> list[list[Transition]]:
        """``mb`` in pieces of at most ``micro_batch_tokens`` padded tokens (see :mod:`marft_algos.microbatch`);
        an action's segments stay together under turn-level ratios."""
        cap = self.config.micro_batch_tokens
        if cap <= 0:
            return [mb]
        rows = micro_batch_rows([len(t.prompt_ids) + len(t.response_ids) for t in mb], cap, self.ratio_groups(mb))
        if len(rows) <= 1:
            return [mb]
        return [mb.subset(r) if isinstance(mb, Minibatch) else [mb[i] for i in r] for r in rows]

    def accumulate_gradients(self, agent: str, pieces: Sequence[list[Transition]]) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward and backward of each piece, its loss scaled by its share of the minibatch's
        loss units, so the summed gradients are the whole minibatch's. Returns the detached
        total loss (non-finite if any piece's was: the step is then skipped) and the
        share-weighted metrics."""
        self.zero_grads(agent)
        weights = [minibatch_weight(self, p) for p in pieces]
        whole = sum(weights)
        total = torch.zeros((), dtype=torch.float64)
        sums: dict[str, float] = defaultdict(float)
        seen: dict[str, float] = defaultdict(float)
        for piece, w in zip(pieces, weights, strict=True):
            share = w / whole if whole > 0 else 1.0 / len(pieces)
            loss, metrics = self.minibatch_loss(agent, piece)
            part = loss * share
            if torch.isfinite(part.detach()).all():  # a non-finite piece skips the whole step below
                (self.scaler.scale(part) if self.scaler is not None else part).backward()
            total += part.detach().double().cpu()
            for k, v in metrics.items():
                sums[k] += v * share
                seen[k] += share
        return total, {k: sums[k] / seen[k] for k in sums if seen[k] > 0}

    def old_logprobs(self, mb: list[Transition], stats: Any) -> torch.Tensor:
        """Old (behaviour) log-probs [B, T] aligned with ``stats.logprobs`` (see :meth:`prepare_update`).

        A minibatch that bypassed :meth:`prepare_update` falls back to the current
        log-probs, detached (ratio 1).
        """
        old = token_field(mb, "old_logp", stats.logprobs.shape[1], stats.logprobs.device)
        return old if old is not None else stats.logprobs.detach()

    def advantages_tensor(self, mb: list[Transition], stats: Any) -> torch.Tensor:
        """Advantages broadcast over tokens -> [B, T] (token-level subclasses override)."""
        adv = action_field(mb, "advantages", torch.float32, stats.logprobs.device)
        return adv[:, None].expand_as(stats.logprobs)

    def ppo_config(self) -> PPOLossConfig:
        """The config as a :class:`~marft_algos.config.PPOLossConfig` (the default losses need its settings)."""
        c = self.config
        if not isinstance(c, PPOLossConfig):
            raise ConfigError(
                f"{type(self).__name__} uses the PPO policy loss, whose settings {type(c).__name__} lacks: "
                "add marft_algos.config.PPOLossConfig to the config's bases, or override policy_loss"
            )
        return c

    def policy_loss(self, agent: str, mb: list[Transition], stats: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped PPO surrogate (+ beta * KL to the reference policy, - ent_coef * entropy)."""
        from marft_algos import losses

        c = self.ppo_config()
        mask = stats.mask.float()
        logp = stats.logprobs
        old_logp = self.old_logprobs(mb, stats)
        adv = self.advantages_tensor(mb, stats)
        tis: dict[str, float] = {}
        weights = self.tis_weights(agent, mb, stats, old_logp, tis)
        if weights is not None:  # w >= 0: w * max(-A rho, -A clip(rho)) is the surrogate with advantages w * A
            adv = adv * weights
        if c.importance_ratio == "token":
            loss, info = losses.ppo_policy_loss(logp, old_logp, adv, mask, eps_low=c.eps_low, eps_high=c.eps_high, agg=c.loss_agg)
        else:  # one ratio per transition, or per action (its tool segments together: ReMA's turn)
            keys: dict[Any, int] = {}
            groups = [keys.setdefault(k, len(keys)) for k in (range(len(mb)) if c.importance_ratio == "sequence" else (t.action_key for t in mb))]
            loss, info = losses.grouped_ratio_policy_loss(logp, old_logp, adv, mask, groups, eps_low=c.eps_low, eps_high=c.eps_high, agg=c.loss_agg)
        m = {f"agent/{agent}/{k}": float(v) for k, v in _as_metrics(info).items()}
        m.update(tis)
        m[f"agent/{agent}/policy_loss"] = float(loss.detach())
        m[f"agent/{agent}/kl"] = float(losses.approx_kl(logp.detach(), old_logp, mask))
        m[f"agent/{agent}/entropy"] = float(losses.masked_mean(stats.entropy.detach(), mask))
        ref_logp = token_field(mb, "ref_logp", logp.shape[1], logp.device) if c.beta > 0 else None
        if ref_logp is not None:
            kl = losses.kl_to_reference(logp, ref_logp, mask)
            loss = loss + c.beta * kl
            m[f"agent/{agent}/ref_kl"] = float(kl.detach())
        if c.ent_coef > 0:
            loss = loss - c.ent_coef * losses.masked_mean(stats.entropy, mask)
        return loss, m

    def extra_losses(self, agent: str, mb: list[Transition], stats: Any) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Hook: additional loss terms on the same minibatch (value loss, entropy bonus, ...)."""
        return None, {}

    def before_optimizer_step(self, agent: str, metrics: dict[str, float]) -> bool:
        """Hook: return False to skip this agent's step (e.g. a KL hard cut)."""
        return True

    def zero_grads(self, agent: str) -> None:
        """Clear the gradients of every optimizer ``agent`` steps (once each: optimizers may be shared)."""
        for opt in {id(o): o for o in (self.optimizers[k] for k in self.optimizer_keys(agent))}.values():
            opt.zero_grad(set_to_none=True)

    def optimizer_step(
        self, agent: str, loss: torch.Tensor, metrics: dict[str, float], *, accumulated: bool = False
    ) -> tuple[bool, dict[str, float]]:
        """Backward + clip + step, guarded: a non-finite loss or gradient never reaches the weights.

        ``accumulated``: the gradients are already in place (:meth:`accumulate_gradients`)
        and ``loss`` is their detached total, checked but not back-propagated.
        Returns (stepped, {optimizer key: grad norm}). Skips are counted in
        ``train/nonfinite_skips`` and logged.
        """
        keys = self.optimizer_keys(agent)
        opts = {k: self.optimizers[k] for k in keys}
        if not accumulated:
            self.zero_grads(agent)
        if self.dist.any(not torch.isfinite(loss.detach()).all()):  # one rank's NaN skips every rank's step
            self._skip_nonfinite(agent, "loss", opts)
            return False, {}
        scaler = self.scaler
        unique: dict[int, tuple[str, torch.optim.Optimizer]] = {}  # shared optimizers once
        for k, opt in opts.items():
            unique.setdefault(id(opt), (k, opt))
        if self.sharding is not None:
            # FSDP reduce-scatters the plain mean of the ranks' gradients: scale each rank's loss by
            # its share of the units so that the mean is the weighted one (as all_reduce_grads does)
            total_w = self.dist.sum([self._dist_weight])[0]
            loss = loss * (self._dist_weight * self.dist.world_size / total_w if total_w > 0 else 0.0)
        if not accumulated:
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if self.dist.active:  # the gradient and metrics of all ranks' data (see marft_algos.distributed)
            for _, opt in unique.values():
                params = [p for g in opt.param_groups for p in g["params"]]
                if self.sharding is None:
                    self.dist.all_reduce_grads(params, self._dist_weight)
                else:  # sharded ones were reduced by FSDP; replicated ones (value heads) carry the scaled loss
                    self.dist.all_reduce_grads([p for p in params if not is_sharded(p)], 1.0)
            metrics.update(self.dist.mean_metrics(metrics, self._dist_weight))
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norms: dict[str, float] = {}
        for k, opt in unique.values():
            if scaler is not None:
                scaler.unscale_(opt)  # clip and check the true gradients
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            if params:
                # error_if_nonfinite=False: we check ourselves and skip instead of raising.
                norms[k] = full_grad_norm(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not all(math.isfinite(v) for v in norms.values()):
            if scaler is not None:
                # An fp16 overflow is the scaler's business (lower the scale, skip this
                # step), not a divergence: counted apart from nonfinite_skips.
                self._skip_overflow(agent, opts)
            else:
                self._skip_nonfinite(agent, "grad", opts)
            return False, norms
        if not self.before_optimizer_step(agent, metrics):
            self.zero_grads(agent)
            if scaler is not None:
                scaler.update()  # closes this scaling round (unscale_ happened)
            return False, norms
        for k, opt in unique.values():
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
            if k in self.schedulers:
                self.schedulers[k].step()
            opt.zero_grad(set_to_none=True)
            self.optimizer_steps[k] += 1
        if scaler is not None:
            scaler.update()
        return True, norms

    def build_scaler(self) -> torch.amp.GradScaler | None:
        """A dynamic loss scaler when the policy computes in fp16, else None.

        fp16 has 5 exponent bits: small gradients of the autocast backward underflow to 0
        unless the loss is scaled up first. bf16 has fp32's range and needs no scaler.
        """
        if getattr(self.policy, "compute_dtype", None) != torch.float16:
            return None
        return torch.amp.GradScaler(self.device.type, init_scale=float(self.config.init_loss_scale))

    def _skip(self, agent: str, counter: str, opts: dict[str, torch.optim.Optimizer]) -> None:
        """Drop this step's gradients and count the skip as ``train/<counter>`` and ``agent/<a>/<counter>``."""
        for opt in opts.values():
            opt.zero_grad(set_to_none=True)
        self.counters[f"train/{counter}"] += 1
        self.counters[f"agent/{agent}/{counter}"] += 1

    def _skip_overflow(self, agent: str, opts: dict[str, torch.optim.Optimizer]) -> None:
        assert self.scaler is not None
        self._skip(agent, "amp_overflow_skips", opts)
        self.scaler.update()  # sees the inf found by unscale_ and lowers the scale

    def _skip_nonfinite(self, agent: str, where: str, opts: dict[str, torch.optim.Optimizer]) -> None:
        self._skip(agent, "nonfinite_skips", opts)
        logging.getLogger("marft").warning(
            "step %d, agent %s: non-finite %s, optimizer step skipped (total skips: %d)",
            self.global_step, agent, where, int(self.counters["train/nonfinite_skips"]),
        )

    def after_update(self, batch: RolloutBatch) -> None:  # noqa: B027  (optional hook)
        """Hook: runs after all minibatches of a step (e.g. sync a target network)."""

    # ---- the loop ----------------------------------------------------------------
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
            return self._train_step()
        finally:
            self._step_groups = None

    def _train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        if self.dist.active:  # each rank samples its own stream, the same one after a resume on any world size
            seed_everything(rank_seed(self.config.seed, self.global_step, self.dist.rank) % 2**32)
        with self.gathered():  # FSDP: each rank decodes on full local weights, no per-step collective
            batch = self.collect()
        t1 = time.perf_counter()
        batch.metrics = self.dist.mean_metrics(batch.metrics, len(batch.episodes))
        self.compute_advantages(batch)  # (a critic gathers FSDP weights itself: see gathered())
        engine = getattr(self.policy, "engine", None)
        if engine is not None:
            engine.sleep()  # vLLM on CUDA: free its KV cache and weights for the update
        metrics = self.dist.mean_metrics(self.update(batch))
        if engine is not None:
            engine.wake_up()
            metrics.update(engine.metrics())  # e.g. the vllm engine's log-prob gap per role
        t2 = time.perf_counter()
        self.global_step += 1
        for key in ("rollout/verifier_timeouts", "rollout/overlong"):
            self.counters[key + "_total"] += batch.metrics.get(key, 0.0)
        for agent in self.agents:  # per agent, for the end-of-run summary
            if batch.metrics.get(f"agent/{agent}/overlong"):
                self.counters[f"agent/{agent}/overlong_total"] += batch.metrics[f"agent/{agent}/overlong"]
        out: dict[str, float] = {"train/step": float(self.global_step)}
        out.update(batch.metrics)
        out.update(metrics)
        out.update({k: float(v) for k, v in self.counters.items()})
        if self.scaler is not None:
            out["train/loss_scale"] = float(self.scaler.get_scale())
        for agent in self.agents:
            if agent in self.schedulers:
                out[f"agent/{agent}/lr"] = float(self.schedulers[agent].get_last_lr()[0])
        out["perf/collect_s"] = t1 - t0
        out["perf/update_s"] = t2 - t1
        out["perf/step_s"] = t2 - t0
        self.history.append(out)
        if self.logger is not None:
            if self.global_step % self.config.log_every == 0:
                self.logger.log(self.global_step, out)
            te = self.config.transcript_every
            if te and (self.global_step % te == 0 or self.global_step == 1):  # step 1: a short run shows one early
                self.write_transcripts(batch)
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
        # one run at a time per run dir (re-entrant: the CLI may hold it already); under a
        # launcher the ranks are one run, and rank 0 holds the lock for all of them
        if c.out_dir and self.dist.is_main:
            from marft_algos.checkpoint import clean_stale
            from marft_algos.rundir import RunDirLock

            lock = RunDirLock(c.out_dir).acquire()
            clean_stale(Path(c.out_dir) / "checkpoints")
        try:
            return self._train_locked(target)
        finally:
            if lock is not None:
                lock.release()

    def _train_locked(self, target: int) -> list[dict[str, float]]:
        from tqdm.auto import tqdm

        from marft_algos.rundir import _test_pause

        c = self.config
        start = time.time()
        bar = tqdm(total=target, initial=self.global_step, disable=not (c.progress and self.dist.is_main), desc=f"{type(self).__name__}", dynamic_ncols=True)
        new: list[dict[str, float]] = []
        try:
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
                _test_pause("step", self.global_step)  # logged, not yet saved (the crash tests)
                if c.out_dir and c.save_every and self.global_step % c.save_every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
        self.warn_overlong_summary()
        last = getattr(self, "last_batch", None)
        if self.logger is not None and last is not None and c.transcript_every and self._transcript_step != self.global_step:
            self.write_transcripts(last)  # every run ends with its last step's transcripts
        if c.out_dir:
            self.save_checkpoint()
            if c.plot and self.logger is not None:
                from marft_algos.plotting import plot_learning_curve

                plot_learning_curve(self.logger.metrics_path, Path(c.out_dir) / "learning_curve.png")
        if self.logger is not None:
            self.logger.flush()
        return new

    _transcript_step: int = -1

    def write_transcripts(self, batch: RolloutBatch) -> None:
        """Append ``transcripts_per_step`` episodes of ``batch`` (prompts included) to transcripts.jsonl."""
        if self.logger is None:
            return
        self.logger.log_transcripts(self.global_step, batch.episodes[: self.config.transcripts_per_step])
        self._transcript_step = self.global_step

    def warn_overlong_summary(self) -> None:
        """End-of-run warning: how many actions of each agent were played empty (prompt over max_context)."""
        from marft_algos.rollout import overlong_summary

        total = int(self.counters.get("rollout/overlong_total", 0))
        if total:
            actions = sum(h.get("rollout/actions", 0.0) for h in self.history)
            logging.getLogger("marft").warning(
                "%d of %d actions overflowed max_context=%d and were played as empty actions (%s): raise max_context "
                "or shorten the prompts (see rollout/overlong in metrics.jsonl)",
                total, int(actions), self.config.max_context, overlong_summary(self.counters, "_total"),
            )

    # ---- checkpoint hooks --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the policy weights (saved by ``policy.save``): extend with super()."""
        seen: dict[int, str] = {}
        opt_states: dict[str, Any] = {}
        for k, opt in self.optimizers.items():
            if id(opt) in seen:
                opt_states[k] = {"alias_of": seen[id(opt)]}
            else:
                seen[id(opt)] = k
                opt_states[k] = opt.state_dict()
        sched_states = {k: s.state_dict() for k, s in self.schedulers.items()}
        return {
            "algo": self.config.algo,
            "global_step": self.global_step,
            "optimizer_steps": dict(self.optimizer_steps),
            "counters": dict(self.counters),
            "optimizers": opt_states,
            "schedulers": sched_states,
            "rng": rng_state(),
            "np_rng": self.np_rng.bit_generator.state,
            "collector": self.collector.state_dict(),
            "history": self.history,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], parts: Collection[str] | None = None) -> None:
        """Restore :meth:`state_dict`, or only the named :data:`~marft_algos.checkpoint.CHECKPOINT_PARTS`
        (policy weights are loaded separately, by ``policy.load``)."""
        from marft_algos.checkpoint import check_parts

        chosen = check_parts(parts)
        if "progress" in chosen:
            self.global_step = int(state["global_step"])
            self.counters = defaultdict(float, state.get("counters", {}))
            self.history = list(state.get("history", []))
        if "optimizers" in chosen:
            self.optimizer_steps = defaultdict(int, state.get("optimizer_steps", {}))
            for k, s in state["optimizers"].items():
                k = self._current_key(k)
                if k in self.optimizers and "alias_of" not in s:
                    self.optimizers[k].load_state_dict(s)
                    if self.sharding is not None:  # full states of a checkpoint -> this rank's shards
                        shard_optimizer_states(self.optimizers[k])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        if "schedulers" in chosen:
            for k, s in state["schedulers"].items():
                k = self._current_key(k)
                if k in self.schedulers:
                    self.schedulers[k].load_state_dict(s)
        if "data" in chosen:
            self.collector.load_state_dict(state["collector"])
        if "rng" in chosen:
            self.np_rng.bit_generator.state = state["np_rng"]
            set_rng_state(state["rng"])

    def _current_key(self, key: str) -> str:
        """An optimizer key of an older checkpoint (``critic``, ``value/<a>``) in today's namespace."""
        if key in self.agents:
            return key
        if key in _LEGACY_KEYS:
            return _LEGACY_KEYS[key]
        if key.startswith("value/") and key[len("value/"):] in self.agents:
            return value_key(key[len("value/"):])
        return key

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

    def load_checkpoint(
        self, path: str | Path, parts: Collection[str] | None = None, *, check_config: bool = True
    ) -> Path:
        """Restore from a checkpoint dir, a ``checkpoints`` root, or a run dir (newest complete one).

        ``parts``: only these :data:`~marft_algos.checkpoint.CHECKPOINT_PARTS` (default all).

        A full resume (``parts`` None) with ``check_config`` (the default) compares the
        checkpoint's settings with this trainer's first (:func:`marft_algos.rundir.resume_changes`;
        loading some parts, e.g. only the weights into another run, is no resume): settings that
        cannot change on resume (env, algorithm, model, team, LoRA shape, data layout, seed)
        raise :class:`~marft_algos.rundir.ResumeConfigError` before anything is loaded;
        other changes apply (the new optimizer settings are written into the restored
        optimizer states) and are listed in ``self.resume_changes``. A checkpoint whose
        files fail to load raises :class:`~marft_algos.checkpoint.CheckpointError`.
        """
        from marft_algos.checkpoint import (
            CheckpointError,
            check_parts,
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


def _as_metrics(info: Any) -> dict[str, float]:
    if info is None:
        return {}
    if isinstance(info, dict):
        out = {}
        for k, v in info.items():
            try:
                out[k] = float(v.detach()) if torch.is_tensor(v) else float(v)
            except (TypeError, ValueError):
                continue
        return out
    return {}


# `from marft_algos.trainer import GRPOConfig` of older subclass authors: the configs live
# beside their algorithms now, which import this module (hence lazily)
__getattr__ = lazy_exports(__name__, {"GRPOConfig": "marft_algos.algos.grpo", "IPPOConfig": "marft_algos.algos.ippo"})
