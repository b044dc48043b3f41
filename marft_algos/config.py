"""Training configurations: the shared parts; each algorithm's config sits beside it (TRL style).

Every field carries ``metadata={"help": ...}``; the CLI builds its flags and its
``--set key=value`` parser from these dataclasses, so a new field is a new flag.
``__post_init__`` rejects invalid combinations at start with a reason; settings that
name agents are checked against the environment's agents by :meth:`TrainConfig.check_agents`
when the trainer is built (the config alone does not know the team).

Parts shared by several algorithms are written once:

- :class:`TrainConfig`: environment, model, optimisation, logging (every algorithm);
- :class:`PPOLossConfig`: the clipped surrogate (``eps_low/eps_high/loss_agg/ent_coef/beta``);
- :class:`CriticConfig`: a learned value function (``critic_lr/vf_coef/value_loss/...``);
- :class:`RecoveryConfig`: collapse recovery, a NESTED part (``recovery.max_rollbacks``).

The loss and critic parts are dataclass mixins, so their fields stay flat: ``--set
eps_low=0.1`` and ``--eps-low 0.1`` read as before, and an algorithm that overrides a
default redeclares one line (:func:`with_default`). Recovery's dozen thresholds are one
nested dataclass instead: they are one feature's knobs, switched on and off together
(``--set recovery.kl_max=2``; ``--recovery-kl-max 2``; ``recovery=false`` is short for
``recovery.enabled=false``).

One vocabulary for all algorithms: ``normalize_advantages`` is one of
:data:`ADVANTAGE_NORMALIZATION` (each algorithm accepts the modes it implements),
``critic_lr`` is the value model's learning rate, ``reward_source`` says which rewards an
action is credited with. Each algorithm's config is imported from its algorithm's module
(``marft_algos.algos.grpo.GRPOConfig``) or from the package (``marft_algos.GRPOConfig``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marft_algos.registry import algorithm_name

__all__ = [
    "ADVANTAGE_NORMALIZATION",
    "BranchingConfig",
    "ConfigError",
    "DEFAULT_MICRO_BATCH_TOKENS",
    "DEFAULT_MICRO_BATCH_TOKENS_GPU",
    "CriticConfig",
    "DistributedConfig",
    "PPOLossConfig",
    "RecoveryConfig",
    "TrainConfig",
    "check_at_least",
    "check_normalization",
    "default_micro_batch_tokens",
    "nested_fields",
    "with_default",
    "config_from_dict",
    "RECORD_KEYS",
    "config_to_dict",
    "apply_overrides",
    "parse_value",
]


class ConfigError(ValueError):
    """An invalid configuration; the message says which setting and why."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def check_at_least(cfg: Any, minimum: Mapping[str, float | tuple[float, str]], prefix: str = "") -> None:
    """Each named setting of ``cfg`` must be >= its minimum (in the order given), else a
    :class:`ConfigError` ``"<prefix><name> must be >= <minimum><note>, got <value>"``;
    a minimum may come with a note on what it means, e.g. ``(0, " (0 = never)")``."""
    for name, bound in minimum.items():
        low, note = bound if isinstance(bound, tuple) else (bound, "")
        value = getattr(cfg, name)
        _check(value >= low, f"{prefix}{name} must be >= {low}{note}, got {value}")


class _AlgorithmName:
    """``Config.algo``: the name the registry knows the config's algorithm by (None for a shared base)."""

    def __get__(self, obj: Any, owner: type) -> str | None:
        return algorithm_name(owner)


#: advantage normalisation modes: raw advantages, whitened over the batch, per agent, per agent
#: and turn (AT-GRPO), or group-relative (GRPO's groups of episodes sharing a problem)
ADVANTAGE_NORMALIZATION = ("none", "batch", "agent", "agent_turn", "group")


def check_normalization(value: str, allowed: tuple[str, ...], algo: str) -> None:
    """Reject a ``normalize_advantages`` value outside the vocabulary or not implemented by ``algo``."""
    _check(
        value in allowed,
        f"normalize_advantages must be one of {list(allowed)} for {algo}, got {value!r}"
        + ("" if value in ADVANTAGE_NORMALIZATION else f" (the vocabulary is {list(ADVANTAGE_NORMALIZATION)})"),
    )


def with_default(part: type, name: str, default: Any) -> Any:
    """A field of a shared config part with another default (same help): ``eps_high: float = with_default(PPOLossConfig, "eps_high", 0.28)``."""
    return field(default=default, metadata=part.__dataclass_fields__[name].metadata)


@functools.cache
def nested_fields(cls: type) -> dict[str, type]:
    """``{field name: part class}`` of the fields whose value is itself a config dataclass (``recovery``)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def _as_part_dict(value: Any) -> dict[str, Any]:
    """A nested part's value (None, bool shorthand for ``enabled``, dict or dataclass) as a dict."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"enabled": value}
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return dict(value)
    raise ConfigError(f"expected a dict of settings (or true/false), got {value!r}")


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    """``data[path] = value`` where ``path`` may be ``part.setting`` of a nested part."""
    head, _, sub = path.partition(".")
    if not sub:
        data[head] = value
        return
    node = _as_part_dict(data.get(head))
    node[sub] = value
    data[head] = node


#: padded tokens of one training forward when micro_batch_tokens is left at -1 on a CPU: a
#: default step of each algorithm on SmolLM2-135M's duo then peaks under 4 GB (issue 28 item 24)
DEFAULT_MICRO_BATCH_TOKENS = 512
#: the same on a GPU, where a piece costs a launch-bound forward and backward whatever its size
#: (an H200 took 4.3-4.9 s for GRPO's update of 32 episodes in 512-token pieces, 0.33-0.39 s
#: in one forward): the cap only stops a large batch from running out of device memory
DEFAULT_MICRO_BATCH_TOKENS_GPU = 16384


def default_micro_batch_tokens(device: str, strategy: str = "none") -> int:
    """What ``micro_batch_tokens=-1`` means: 0 (no cap) under FSDP, else the device kind's cap."""
    if strategy == "fsdp":
        return 0
    return DEFAULT_MICRO_BATCH_TOKENS_GPU if _on_accelerator(device) else DEFAULT_MICRO_BATCH_TOKENS


def _on_accelerator(device: str) -> bool:
    """Whether ``device`` (as TrainConfig spells it) trains on something other than the CPU."""
    if device != "auto":
        return device.split(":")[0] != "cpu"
    import torch  # deferred: config stays torch-free unless "auto" must be resolved

    return torch.cuda.is_available()  # how the policy resolves "auto" (models/policy.py)


_DTYPE_NAMES = frozenset({"bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float"})

#: sampling settings of ``sampling_overrides`` and their types (checked at config time,
#: not at the first generation)
_SAMPLING_TYPES: dict[str, Any] = {"temperature": float, "top_p": float, "top_k": int, "max_new_tokens": int, "stop": Any, "greedy": bool}


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_type(name: str, value: Any, annotation: Any) -> None:
    """Reject a value of the wrong type for a simple annotation (bool, int, float, str, dict, list,
    ``X | None``); floats must also be finite: no setting means something at NaN or inf
    (``None`` switches the optional ones off, ``0`` the others)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            _check_type(name, value, rest[0])
        return  # wider unions: not checked here
    if annotation is bool:
        _check(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
    elif annotation is int:
        _check(
            isinstance(value, numbers.Integral) and not isinstance(value, bool),
            f"{name} must be an integer, got {value!r}" + (" (not finite)" if isinstance(value, float) and not math.isfinite(value) else ""),
        )
    elif annotation is float:
        _check(isinstance(value, numbers.Real) and not isinstance(value, bool), f"{name} must be a number, got {value!r}")
        _check(math.isfinite(float(value)), f"{name} must be a finite number, got {value!r}")
    elif annotation is str:
        _check(isinstance(value, str), f"{name} must be a string, got {value!r}")
    elif annotation is dict or origin is dict:
        _check(isinstance(value, dict), f"{name} must be a dict (a JSON object), got {value!r}")
    elif annotation in (list, tuple) or origin in (list, tuple):
        _check(isinstance(value, (list, tuple)), f"{name} must be a list, got {value!r}")


def _check_field_types(obj: Any, prefix: str = "") -> None:
    """Type-check every simple field of a config dataclass (see :func:`_check_type`)."""
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        ann = hints.get(f.name)
        if ann is None or dataclasses.is_dataclass(ann):
            continue
        value = getattr(obj, f.name)
        if isinstance(value, os.PathLike) and str in (ann, *typing.get_args(ann)):
            value = os.fspath(value)  # a Path where a path string is expected
            object.__setattr__(obj, f.name, value)
        _check_type(prefix + f.name, value, ann)


@dataclass
class DistributedConfig:
    """Multi-process training (:mod:`marft_algos.distributed`); read only under a launcher (torchrun, accelerate)."""

    backend: str = field(default="auto", metadata={"help": "Process-group backend: 'auto' (nccl on CUDA, gloo on CPU), 'gloo' or 'nccl'."})
    timeout_s: float = field(default=1800.0, metadata={"help": "Seconds a collective may wait for the other ranks before the job fails (never a hang)."})
    strategy: str = field(default="ddp", metadata={"help": "'ddp': every rank holds the weights, gradients are averaged; 'fsdp': FSDP2 shards full fine-tuning (mode='full') over the ranks."})

    def __post_init__(self) -> None:
        _check(self.backend in ("auto", "gloo", "nccl"), f"distributed.backend must be 'auto', 'gloo' or 'nccl', got {self.backend!r}")
        _check(self.timeout_s > 0, f"distributed.timeout_s must be > 0, got {self.timeout_s}")
        _check(self.strategy in ("ddp", "fsdp"), f"distributed.strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")


@dataclass
class TrainConfig:
    """Settings shared by all trainers (environment, model, optimisation, logging)."""

    # --- environment -------------------------------------------------------------
    env_id: str = field(default="arith-duo-v0", metadata={"help": "Registered environment id (see `marft list-envs`)."})
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"help": "Extra keyword arguments for marft_envs.make (JSON-safe)."})
    num_envs: int = field(default=16, metadata={"help": "Environment copies (episodes) collected per training step."})
    seed: int = field(default=0, metadata={"help": "Seed for problem sampling, generation and minibatch order."})
    # --- model -------------------------------------------------------------------
    model: str = field(default="smollm2-135m", metadata={"help": "Base model: alias (smollm2-135m, qwen2.5-coder-0.5b, tiny-random), Hub id or local path."})
    model_per_agent: dict[str, str] = field(default_factory=dict, metadata={"help": "Heterogeneous team: {agent: base model}; each distinct base is loaded once."})
    mode: str = field(default="lora", metadata={"help": "'lora' (one adapter per agent), 'shared' (one adapter for all agents) or 'full' fine-tuning."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout; must be 0 for training (log-probs are computed without dropout, like the sampled ones)."})
    device: str = field(default="auto", metadata={"help": "'auto', 'cpu', 'cuda', 'cuda:1', ..."})
    dtype: str | None = field(default=None, metadata={"help": "Compute dtype: None (fp32 on CPU, bf16 autocast on GPU), 'bf16', 'fp16' or 'fp32'. Parameters stay fp32 (master weights); fp16 adds dynamic loss scaling (init_loss_scale)."})
    init_from: str | None = field(default=None, metadata={"help": "Start from the adapters (or full weights) of another run: a `marft sft` run dir (docs/sft.md), a run dir or a checkpoint dir; the model, mode and LoRA shape must match. None: fresh adapters."})
    reference: str = field(default="base", metadata={"help": "The reference policy of the KL penalty (beta) and of agent/<a>/rollout_ref_kl: 'base' = the base model with the adapters off (mode='full': the initial weights); 'init' = the weights init_from loaded, frozen (after an SFT warm start the penalty then keeps RL near the SFT policy, as TRL and ReMA do; needs init_from)."})
    activation_checkpointing: bool = field(default=False, metadata={"help": "Recompute each decoder layer in the backward pass instead of storing its activations: a training step's memory stops growing with tokens x layers (about one more forward of cost; training forwards then skip prefix sharing)."})
    release_freed_memory: bool = field(default=False, metadata={"help": "CPU/glibc: pin malloc's mmap and trim thresholds at 128 KiB so memory freed between the phases of a step goes back to the OS (lower peak RSS, slower steps; process-wide; see marft_algos.memory)."})
    max_context: int = field(default=2048, metadata={"help": "Max prompt+response tokens; longer prompts are counted (rollout/overlong) and not trained on."})
    strict_context: bool = field(default=False, metadata={"help": "Stop the run with an error when an agent's prompt does not fit max_context (default: warn once, play an empty action, count it in rollout/overlong)."})
    sampling_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": "{agent: {temperature, top_p, max_new_tokens, stop}} over the profile's train sampling."})
    eval_sampling_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": "{agent: {...}} over the profile's eval sampling."})
    engine: str = field(default="hf", metadata={"help": "Generation engine for rollouts: 'hf' (built in, the default) or 'vllm' (needs vLLM: pip install 'marft[vllm]'; LoRA modes, one base; see docs/engines.md)."})
    engine_options: dict[str, Any] = field(default_factory=dict, metadata={"help": "Keyword options of the engine, e.g. for vllm {gpu_memory_utilization, max_model_len, enforce_eager, dtype, max_num_seqs, adapter_root, logprob_source}."})
    # --- optimisation ------------------------------------------------------------
    steps: int = field(default=50, metadata={"help": "Training steps (collect -> advantages -> update)."})
    max_minutes: float | None = field(default=None, metadata={"help": "Stop after this many minutes of training (checked between steps)."})
    mask_length_stops: bool = field(default=False, metadata={"help": "DAPO's overlong filtering: an action cut by its max_new_tokens (finish_reason 'length') gets no policy-gradient signal (its advantage, and its token advantages, set to 0 after the estimator; the critic still learns its value; it still counts in the loss's mean). Counted in train/length_stops_masked. Not a cure for an agent drifting into its limit: once every reply is cut and masked it gets no gradient back (measured: marft_algos.length_stops)."})
    length_stop_warn: float = field(default=0.5, metadata={"help": "Warn when an agent's share of actions cut by its max_new_tokens (agent/<a>/length_stop_frac), averaged over 3 steps, reaches this (0: never); see marft_algos.length_stops.LengthStopWatch."})
    lr: float = field(default=1e-5, metadata={"help": "Learning rate of every agent's policy parameters."})
    lr_per_agent: dict[str, float] = field(default_factory=dict, metadata={"help": "{agent: lr} overriding `lr` per agent."})
    frozen_agents: list[str] = field(default_factory=list, metadata={"help": "Agents that act but are never trained: no optimizer, no update, their adapters stay exactly as loaded (the critic still learns from their data)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    lr_scheduler: str = field(default="constant", metadata={"help": "'constant' or 'linear' decay to 0 at `steps`, both after `warmup_steps`."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps (optimizer steps, per agent)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (per agent); <= 0 disables clipping."})
    init_loss_scale: float = field(default=2.0**16, metadata={"help": "fp16 only: initial dynamic loss scale (halved on an overflow, doubled after 2000 clean steps)."})
    ppo_epochs: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    num_minibatches: int = field(default=1, metadata={"help": "Minibatches per agent per epoch."})
    collect_threads: int = field(default=0, metadata={"help": "CPU: torch threads while collecting rollouts; 0 = 1 (decode on two threads collapses on a busy machine: benchmarks/threads.py), capped by OMP_NUM_THREADS."})
    update_threads: int = field(default=0, metadata={"help": "CPU: torch threads for the estimate and update phases; 0 = 2, capped by the cores and OMP_NUM_THREADS."})
    rollout_workers: int = field(default=0, metadata={"help": "Asynchronous rollouts: this many worker processes generate batches while the trainer updates (each with its own policy copy, synced after every update; see docs/async.md). 0 (default) = synchronous collection in the trainer's process."})
    max_staleness: int = field(default=0, metadata={"help": "With rollout_workers > 0: a batch may come from a policy up to this many updates older than the one it trains (AReaL's bound). 0 = workers always generate with the newest weights (the run equals the synchronous one)."})
    rollout_device: str = field(default="", metadata={"help": "With rollout_workers > 0: the device the workers generate on ('cpu', 'cuda:1', ...); '' = the trainer's `device`."})
    rollout_timeout_s: float = field(default=1800.0, metadata={"help": "With rollout_workers > 0: seconds the trainer waits for a worker to start or to deliver a batch before the run stops with an error (never a hang)."})
    rollout_restarts: int = field(default=0, metadata={"help": "With rollout_workers > 0: how many times a worker that died is restarted (its batches are generated again) before the run stops with an error."})
    micro_batch_tokens: int = field(default=-1, metadata={"help": f"Cap on the padded tokens (rows x longest prompt+response) of one training forward: a minibatch above it runs in pieces whose gradients add up before its one optimizer step (gradient accumulation; memory stops growing with the minibatch). 0 = no cap; -1 (the default) = {DEFAULT_MICRO_BATCH_TOKENS} on a CPU, {DEFAULT_MICRO_BATCH_TOKENS_GPU} on a GPU, 0 under distributed.strategy='fsdp' (which runs no micro-batches)."})
    # --- logging / checkpoints ---------------------------------------------------
    out_dir: str | None = field(default=None, metadata={"help": "Run directory (metrics, transcripts, checkpoints, plot)."})
    log_every: int = field(default=1, metadata={"help": "Write metrics every N steps."})
    transcript_every: int = field(default=10, metadata={"help": "Save sample transcripts every N steps (0 = never)."})
    transcripts_per_step: int = field(default=2, metadata={"help": "Episodes written per transcript dump."})
    strict_programs: bool = field(default=False, metadata={"help": "Stop the run at the first episode whose program (workflow / program env) raised, with its traceback, instead of training on its reward 0 (counted as rollout/program_errors, the first traceback printed)."})
    save_every: int = field(default=0, metadata={"help": "Checkpoint every N steps (0 = only at the end)."})
    keep_checkpoints: int = field(default=2, metadata={"help": "Checkpoints kept on disk (the newest ones)."})
    tensorboard: bool = field(default=True, metadata={"help": "Also write TensorBoard events."})
    progress: bool = field(default=True, metadata={"help": "Show a tqdm progress bar with the live team reward."})
    plot: bool = field(default=True, metadata={"help": "Write learning_curve.png at the end."})
    distributed: DistributedConfig = field(default_factory=DistributedConfig, metadata={"help": "Multi-process training under torchrun / accelerate launch (nested: distributed.<setting>=...; see docs/distributed.md)."})

    #: the registered name of this config's algorithm (from the registry, never restated here)
    algo = _AlgorithmName()
    #: fields whose dict keys are agent names (validated by check_agents)
    per_agent_fields: typing.ClassVar[tuple[str, ...]] = (
        "model_per_agent",
        "sampling_overrides",
        "eval_sampling_overrides",
        "lr_per_agent",
        "frozen_agents",
    )

    def __post_init__(self) -> None:
        for name, part in nested_fields(type(self)).items():  # dicts (JSON, --set) and the bool shorthand
            value = getattr(self, name)
            if not isinstance(value, part):
                data = _as_part_dict(value)
                valid = {f.name for f in dataclasses.fields(part)}
                unknown = sorted(set(data) - valid)
                _check(not unknown, f"unknown {name} settings {unknown}; valid: {sorted(valid)}")
                object.__setattr__(self, name, part(**data))
            _check_field_types(getattr(self, name), prefix=f"{name}.")
        if isinstance(self.frozen_agents, str):  # --frozen-agents writer,critic
            self.frozen_agents = [a.strip() for a in self.frozen_agents.split(",") if a.strip()]
        _check(
            isinstance(self.frozen_agents, (list, tuple)) and all(isinstance(a, str) for a in self.frozen_agents),
            f"frozen_agents must be a list of agent names, got {self.frozen_agents!r}",
        )
        self.frozen_agents = list(self.frozen_agents)
        _check_field_types(self)
        for agent, lr in self.lr_per_agent.items():
            _check_type(f"lr_per_agent[{agent!r}]", lr, float)
        for agent, base in self.model_per_agent.items():
            _check_type(f"model_per_agent[{agent!r}]", base, str)
        for name in ("sampling_overrides", "eval_sampling_overrides"):
            for agent, sp in getattr(self, name).items():
                _check(isinstance(sp, dict), f"{name}[{agent!r}] must be a dict of sampling settings, got {sp!r}")
                for key, value in sp.items():
                    if _SAMPLING_TYPES.get(key, Any) is not Any:
                        _check_type(f"{name}[{agent!r}].{key}", value, _SAMPLING_TYPES[key])
        check_at_least(self, {"num_envs": 1, "steps": 0})
        _check(self.mode in ("lora", "shared", "full"), f"mode must be 'lora', 'shared' or 'full', got {self.mode!r}")
        _check(self.lr > 0 and math.isfinite(self.lr), f"lr must be a positive finite number, got {self.lr}"
               + ("; to keep agents fixed, list them in frozen_agents" if self.lr == 0 else ""))
        for agent, lr in self.lr_per_agent.items():
            _check(lr > 0 and math.isfinite(lr), f"lr_per_agent[{agent!r}] must be positive, got {lr}"
                   + ("; to keep an agent fixed, list it in frozen_agents" if lr == 0 else ""))
        _check(self.reference in ("base", "init"), f"reference must be 'base' or 'init', got {self.reference!r}")
        _check(self.reference == "base" or self.init_from is not None,
               "reference='init' makes the weights init_from loaded the KL reference: set init_from (e.g. --init RUN) or use reference='base'")
        _check(self.lr_scheduler in ("constant", "linear"), f"lr_scheduler must be 'constant' or 'linear', got {self.lr_scheduler!r}")
        if self.micro_batch_tokens == -1:  # the default bounds a step's memory (issue 28 item 24)
            self.micro_batch_tokens = default_micro_batch_tokens(self.device, self.distributed.strategy)
        check_at_least(self, {
            "warmup_steps": 0, "ppo_epochs": 1, "num_minibatches": 1, "max_context": (8, " tokens"), "lora_r": 1,
            "micro_batch_tokens": (0, " (0 = no cap)"), "collect_threads": (0, " (0 = the phase's default)"), "update_threads": (0, " (0 = the phase's default)"),
        })
        check_at_least(self, {"rollout_workers": (0, " (0 = synchronous collection)"), "max_staleness": 0, "rollout_restarts": 0})
        _check(self.rollout_timeout_s > 0, f"rollout_timeout_s must be > 0, got {self.rollout_timeout_s}")
        _check(not self.rollout_device or _valid_device(self.rollout_device),
               f"unknown rollout_device {self.rollout_device!r}; use '' (the trainer's device), 'cpu', 'cuda:<index>' or another torch device string")
        _check(self.lora_alpha > 0, f"lora_alpha must be > 0 (the adapter's scale is alpha / r), got {self.lora_alpha}")
        check_at_least(self, {
            "log_every": 1, "save_every": (0, " (0 = only at the end)"), "keep_checkpoints": (0, " (0 = keep all)"),
            "transcript_every": (0, " (0 = never)"), "transcripts_per_step": 0, "weight_decay": 0,
        })
        _check(self.adam_eps > 0, f"adam_eps must be > 0, got {self.adam_eps}")
        _check(self.device == "auto" or _valid_device(self.device),
               f"unknown device {self.device!r}; use 'auto', 'cpu', 'cuda', 'cuda:<index>', 'mps' or another torch device string")
        _check(self.init_loss_scale > 0 and math.isfinite(self.init_loss_scale), f"init_loss_scale must be a positive finite number, got {self.init_loss_scale}")
        _check(self.max_minutes is None or self.max_minutes > 0, f"max_minutes must be > 0, got {self.max_minutes}")
        # The sampler runs without dropout, so the new log-probs must too (else every PPO
        # ratio and KL carries dropout-mask noise): a LoRA dropout would never be applied.
        _check(
            self.lora_dropout == 0,
            f"lora_dropout must be 0 for RL training, got {self.lora_dropout}: log-probs are computed without dropout, "
            "exactly like the sampled ones, so that the PPO ratio compares the same function",
        )
        from marft_algos.engines import check_engine_options

        try:
            check_engine_options(self.engine, self.engine_options)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        _check(
            not (self.engine == "vllm" and self.mode == "full"),
            "engine='vllm' trains LoRA adapters only (mode='lora' or 'shared'): full weights cannot be pushed into vLLM after each update",
        )
        if self.dtype is not None:
            key = str(self.dtype).lower().removeprefix("torch.")
            _check(key in _DTYPE_NAMES, f"unknown dtype {self.dtype!r}; use one of {sorted(_DTYPE_NAMES)} or None")
        if self.distributed.strategy == "fsdp":
            self.check_fsdp()
        for name in ("sampling_overrides", "eval_sampling_overrides"):
            for agent, sp in getattr(self, name).items():
                _check(isinstance(sp, dict), f"{name}[{agent!r}] must be a dict of sampling settings")
                unknown = set(sp) - {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "greedy"}
                _check(not unknown, f"{name}[{agent!r}]: unknown sampling settings {sorted(unknown)}")
                _check(sp.get("temperature", 1.0) >= 0, f"{name}[{agent!r}]: temperature must be >= 0")
                _check(0 < sp.get("top_p", 1.0) <= 1, f"{name}[{agent!r}]: top_p must be in (0, 1]")
                _check(sp.get("max_new_tokens", 1) >= 1, f"{name}[{agent!r}]: max_new_tokens must be >= 1")

    # --- helpers -----------------------------------------------------------------
    def check_fsdp(self) -> None:
        """Refuse what ``distributed.strategy='fsdp'`` does not support (see docs/distributed.md)."""
        _check(
            not self.model_per_agent,
            "distributed.strategy='fsdp' shards one base model: a heterogeneous team (model_per_agent) is not supported "
            "with it; use distributed.strategy='ddp'",
        )
        _check(
            self.engine == "hf",
            f"distributed.strategy='fsdp' generates with the built-in 'hf' engine on the gathered weights; engine={self.engine!r} "
            "keeps its own copy of the weights: use distributed.strategy='ddp' with it",
        )
        key = str(self.dtype).lower().removeprefix("torch.") if self.dtype is not None else None
        _check(
            key not in ("fp16", "float16", "half"),
            "distributed.strategy='fsdp' has no fp16 loss scaling: use dtype='bf16' (or None), or distributed.strategy='ddp'",
        )
        # FSDP reduce-scatters at every backward: pieces would need the same count on every rank
        _check(
            self.micro_batch_tokens == 0,
            "distributed.strategy='fsdp' does not run micro-batches (micro_batch_tokens > 0): use num_minibatches to "
            "shrink each forward, activation_checkpointing=True, or distributed.strategy='ddp'",
        )

    def check_agents(self, agents: list[str] | tuple[str, ...]) -> None:
        """Reject per-agent settings that name agents the environment does not have."""
        internal = [a for a in agents if str(a).startswith("__")]
        _check(
            not internal,
            f"agent names {internal} start with '__', the namespace of the trainers' internal optimizers and "
            "adapters (the critic, value heads): rename these roles",
        )
        known = set(agents)
        for name in self.per_agent_fields:
            unknown = sorted(set(getattr(self, name)) - known)
            _check(not unknown, f"{name} names unknown agents {unknown}; the environment's agents are {list(agents)}")
        _check(
            not known <= set(self.frozen_agents),
            f"frozen_agents {sorted(self.frozen_agents)} freezes the whole team: nothing would be trained",
        )

    def agent_lr(self, agent: str) -> float:
        """The learning rate of ``agent``'s policy (``lr_per_agent`` over ``lr``)."""
        return float(self.lr_per_agent.get(agent, self.lr))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict with the algorithm name (see :func:`config_to_dict`)."""
        return config_to_dict(self)

    def save(self, path: str | Path) -> None:
        """Write the config as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a config written by :meth:`save` (unknown keys are an error)."""
        data = json.loads(Path(path).read_text())
        data.pop("algo", None)
        return config_from_dict(cls, data)


def _valid_device(name: str) -> bool:
    """A device string torch parses (``cpu``, ``cuda:1``, ``mps``); whether it exists is checked when the model loads."""
    import torch  # only for a non-default device

    try:
        torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def _chain_post_init(obj: Any, part: type) -> None:
    """Run the next ``__post_init__`` in the MRO after ``part`` (mixins are used alone too)."""
    nxt = getattr(super(part, obj), "__post_init__", None)
    if nxt is not None:
        nxt()


@dataclass
class PPOLossConfig:
    """The clipped-surrogate policy loss (PPO, DAPO clip-higher), entropy bonus and KL to the reference."""

    eps_low: float = field(default=0.2, metadata={"help": "Lower PPO clip range (ratio >= 1 - eps_low)."})
    eps_high: float = field(default=0.2, metadata={"help": "Upper PPO clip range (ratio <= 1 + eps_high); > eps_low is DAPO clip-higher."})
    loss_agg: str = field(default="token", metadata={"help": "Per-token losses: 'token' (mean over all real tokens of the minibatch) or 'sequence' (mean per action, then over actions); action-level MARFT has one ratio per action and ignores it."})
    importance_ratio: str = field(default="token", metadata={"help": "PPO ratio of the shared policy loss (GRPO, IPPO): 'token' (one per token), 'sequence' (one per transition: exp of its mean token log-ratio, GSPO) or 'turn' (ReMA: one per action, i.e. per agent and turn, over all its segments; = 'sequence' for single-segment actions). MARFT's losses have their own ratios and refuse other values."})
    ent_coef: float = field(default=0.0, metadata={"help": "Entropy bonus coefficient (paper: 0.1 / 0.01 / 0 by task)."})
    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference policy (see reference: by default the base with adapters disabled; with mode='full' the frozen initial weights); 0 disables it."})
    kl_sample: int = field(default=16, metadata={"help": "Actions per agent and step on which two KL diagnostics are measured without gradient: agent/<a>/rollout_ref_kl, KL(rollout policy || reference) before the update (whatever beta is), and agent/<a>/update_kl, KL(rollout policy || updated policy) after it (what collapse recovery's kl_max watches); their time is perf/kl_diagnostics_s, part of perf/update_s; 0 = off."})
    tis_cap: float = field(default=2.0, metadata={"help": "Truncated importance sampling (TIS) cap C, used when the engine keeps its own log-probs (engine_options logprob_source='engine') and on stale batches of asynchronous rollouts (max_staleness > 0, docs/async.md): the policy-gradient term is weighted by min(exp(trainer old log-prob - engine log-prob), C), per token (per action in action-level MARFT)."})

    def __post_init__(self) -> None:
        _chain_post_init(self, PPOLossConfig)
        _check(0 <= self.eps_low < 1, f"eps_low must be in [0, 1), got {self.eps_low}")
        _check(self.eps_high >= self.eps_low, f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low}) (clip-higher widens the upper range)")
        _check(self.loss_agg in ("token", "sequence"), f"loss_agg must be 'token' or 'sequence', got {self.loss_agg!r}")
        _check(self.importance_ratio in ("token", "sequence", "turn"), f"importance_ratio must be 'token', 'sequence' or 'turn', got {self.importance_ratio!r}")
        check_at_least(self, {"ent_coef": 0, "beta": 0, "kl_sample": 0})
        _check(self.tis_cap > 0 and math.isfinite(self.tis_cap), f"tis_cap must be a positive finite number, got {self.tis_cap}")


@dataclass
class BranchingConfig:
    """Branching rollouts and tree (counterfactual) credit (:mod:`marft_algos.branching`, docs/credit.md)."""

    branching: int = field(default=1, metadata={"help": "Sibling actions sampled at each agent turn from one observation (the env is copied; the tree continues below every sibling): each action's advantage is its leaves' mean return minus the mean over its siblings (counterfactual credit, predecessors held fixed). 1 = independent episodes (today's rollouts). Leaves per root copy: branching^actions with branch_expand='all'."})
    branch_expand: str = field(default="all", metadata={"help": "branching > 1: 'all' (full tree: every sibling branches again; for small teams) or 'random' (budgeted tree: one sibling drawn at random branches on, the others are played out as single chains: 1 + (branching - 1) x actions leaves per root copy)."})
    branch_depth: int = field(default=0, metadata={"help": "branching > 1: branch only at the first N actions of each path (0 = at every action)."})

    def __post_init__(self) -> None:
        _chain_post_init(self, BranchingConfig)
        check_at_least(self, {"branching": (1, " (1 = independent episodes)"), "branch_depth": (0, " (0 = every action)")})
        _check(self.branch_expand in ("all", "random"), f"branch_expand must be 'all' or 'random', got {self.branch_expand!r}")

    def branch_collector(self, collector: Any) -> None:
        """Switch ``collector`` to trees when ``branching > 1`` (nothing changes at 1)."""
        if self.branching > 1:
            collector.set_branching(self.branching, self.branch_expand, self.branch_depth)


@dataclass
class CriticConfig:
    """A learned value function: its learning rate, loss and weight."""

    critic_lr: float = field(default=1e-4, metadata={"help": "Learning rate of the value model (IPPO's value heads, MARFT's critic; paper: 1e-5 for a full MLP head on a 0.5B+ model)."})
    vf_coef: float = field(default=1.0, metadata={"help": "Value loss coefficient (the value model has its own optimizer; this scales its gradient)."})
    value_loss: str = field(default="huber", metadata={"help": "'huber' (symmetric) or 'mse'."})
    huber_delta: float = field(default=10.0, metadata={"help": "Huber delta."})
    value_clip: float | None = field(default=None, metadata={"help": "Clip value predictions to +-value_clip around the rollout values (None = off)."})

    def __post_init__(self) -> None:
        _chain_post_init(self, CriticConfig)
        _check(self.critic_lr > 0 and math.isfinite(self.critic_lr), f"critic_lr must be > 0, got {self.critic_lr}")
        _check(self.vf_coef >= 0, f"vf_coef must be >= 0, got {self.vf_coef}")
        _check(self.value_loss in ("huber", "mse"), f"value_loss must be 'huber' or 'mse', got {self.value_loss!r}")
        _check(self.huber_delta > 0, f"huber_delta must be > 0, got {self.huber_delta}")
        _check(self.value_clip is None or self.value_clip > 0, f"value_clip must be > 0 or None, got {self.value_clip}")


@dataclass
class RecoveryConfig:
    """Collapse recovery (:mod:`marft_algos.recovery`): detectors' thresholds (``None`` disables one) and the rollback."""

    enabled: bool = field(default=True, metadata={"help": "Detect collapses (NaN/inf, entropy surge, KL spike, reward collapse) and roll back."})
    entropy_factor: float | None = field(default=3.0, metadata={"help": "Entropy surge: entropy > factor x its running baseline (None = off)."})
    entropy_min_delta: float = field(default=1.0, metadata={"help": "Entropy surge also needs entropy - baseline > this (nats)."})
    entropy_max: float | None = field(default=None, metadata={"help": "Entropy surge: absolute ceiling (None = off)."})
    kl_max: float | None = field(default=1.0, metadata={"help": "KL spike: an agent's KL(rollout policy || updated policy) after the update (agent/<a>/update_kl) above this (None = off)."})
    ref_kl_max: float | None = field(default=None, metadata={"help": "KL spike: an agent's KL to the reference (agent/<a>/rollout_ref_kl, else the loss's agent/<a>/ref_kl) above this (None = off)."})
    reward_drop: float | None = field(default=0.5, metadata={"help": "Reward collapse: the fast reward EMA below (1 - drop) x the run's reference level (None = off)."})
    reward_min: float = field(default=0.2, metadata={"help": "Reward collapse is only checked once the reference level reaches this."})
    reward_ema: float = field(default=0.5, metadata={"help": "Weight of the newest step in the fast reward EMA (what the last few steps earned)."})
    reward_ref_ema: float = field(default=0.1, metadata={"help": "Weight of the newest healthy step in the slow reference level (steps below the drop line are left out)."})
    reward_z: float | None = field(default=3.0, metadata={"help": "Reward collapse also needs the drop to exceed this many standard errors of the fast EMA, bounded by the reward range over the step's problems (rollout/problems, else rollout/episodes) (None = the ratio alone)."})
    reward_low: float = field(default=0.0, metadata={"help": "Lowest reward an episode can earn (bounds the reward noise)."})
    reward_high: float = field(default=1.0, metadata={"help": "Highest reward an episode can earn (bounds the reward noise)."})
    baseline_ema: float = field(default=0.3, metadata={"help": "Weight of the newest healthy step in the entropy baselines."})
    warmup: int = field(default=2, metadata={"help": "Healthy steps before the entropy and reward detectors are armed."})
    every: int = field(default=1, metadata={"help": "Save a recovery checkpoint every N healthy steps."})
    lr_factor: float = field(default=0.5, metadata={"help": "Multiply every learning rate by this on each rollback."})
    max_rollbacks: int = field(default=3, metadata={"help": "Stop at the next collapse after this many rollbacks: the last good checkpoint is restored once more and CollapseError raised."})

    def __post_init__(self) -> None:
        _check(0 < self.lr_factor <= 1, f"recovery.lr_factor must be in (0, 1], got {self.lr_factor}")
        check_at_least(self, {"every": 1, "max_rollbacks": 0}, prefix="recovery.")
        _check(
            self.reward_drop is None or 0 < self.reward_drop < 1,
            f"recovery.reward_drop must be in (0, 1) or None, got {self.reward_drop}",
        )
        for name in ("reward_ema", "reward_ref_ema"):
            value = getattr(self, name)
            _check(0 < value <= 1, f"recovery.{name} must be in (0, 1], got {value}")
        _check(self.reward_z is None or self.reward_z >= 0, f"recovery.reward_z must be >= 0 or None, got {self.reward_z}")
        _check(
            self.reward_low < self.reward_high,
            f"recovery.reward_low must be below recovery.reward_high, got {self.reward_low} and {self.reward_high}: set them to the env's reward range",
        )


# --- (de)serialisation and overrides ---------------------------------------------------


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """JSON-safe dict of a config, with its algorithm name under ``"algo"``."""
    data = dataclasses.asdict(config)
    data["algo"] = config.algo
    return data


#: keys of a run's config.json that are records, not settings (``--config run/config.json`` works)
RECORD_KEYS = frozenset({"algo", "env_record"})


def config_from_dict(cls: type[TrainConfig], data: dict[str, Any]) -> TrainConfig:
    """Build ``cls`` from a dict; unknown keys are an error that lists the valid ones.

    Nested parts come as dicts (``{"recovery": {"max_rollbacks": 3}}``).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - RECORD_KEYS)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings {unknown}; valid settings: {sorted(names)}")
    return cls(**{k: v for k, v in data.items() if k not in RECORD_KEYS})


def _field_types(cls: type[TrainConfig]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def parse_value(text: str, annotation: Any) -> Any:
    """Parse a command-line string into the type a config field is annotated with."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if text.lower() in ("none", "null"):
            return None
        return parse_value(text, args[0])
    if annotation is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"expected a boolean (true/false), got {text!r}")
    if annotation in (int, float):
        try:
            return annotation(text)
        except ValueError:
            raise ConfigError(f"expected {annotation.__name__}, got {text!r}") from None
    if annotation is str:
        return text
    if origin in (list, tuple) and not text.lstrip().startswith("["):
        # a comma list (``frozen_agents=editor`` or ``=a,b``), as the docs write it; items
        # parsed by the element type
        elem = args[0] if args and args[0] is not Ellipsis else str
        items = [t.strip() for t in text.split(",") if t.strip()]
        return [parse_value(t, elem) if elem in (bool, int, float, str) else _loose_value(t) for t in items]
    # dicts / lists: JSON
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"expected JSON for a {annotation}, got {text!r} ({e})") from None
    return value


def _loose_value(text: str) -> Any:
    """JSON when the text parses as JSON, None for none/null, else the text itself."""
    if text.lower() in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(cls: type[TrainConfig], base: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to a dict of settings for ``cls``.

    ``key`` may be dotted into a nested part (``recovery.max_rollbacks=3``, parsed by that
    setting's type) or into a dict field (``sampling_overrides.actor.temperature=0.7``).
    Unknown keys raise :class:`ConfigError` with a suggestion.
    """
    types = _field_types(cls)
    nested = nested_fields(cls)
    out = dict(base)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        head, *rest = key.split(".")
        if head not in types:
            close = difflib.get_close_matches(head, list(types), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown setting {head!r} for {cls.__name__}{hint}")
        if head in nested:
            part = nested[head]
            if not rest:  # recovery=false (shorthand for recovery.enabled) or a JSON dict
                out[head] = _part_value(head, text)
                continue
            sub_types = typing.get_type_hints(part)
            sub = ".".join(rest)
            if sub not in sub_types:
                close = difflib.get_close_matches(sub, list(sub_types), n=1)
                hint = f"; did you mean {head}.{close[0]}?" if close else ""
                raise ConfigError(f"unknown setting {head}.{sub} for {cls.__name__}{hint}")
            _put(out, f"{head}.{sub}", parse_value(text, sub_types[sub]))
            continue
        if not rest:
            out[head] = parse_value(text, types[head])
            continue
        # dotted path into a dict field: JSON-parse the leaf when possible
        try:
            leaf: Any = json.loads(text)
        except json.JSONDecodeError:
            leaf = text
        node = out.setdefault(head, {})
        node = dict(node) if isinstance(node, dict) else {}
        out[head] = node
        for part_key in rest[:-1]:
            node[part_key] = dict(node.get(part_key, {}))
            node = node[part_key]
        node[rest[-1]] = leaf
    return out


def _part_value(head: str, text: str) -> dict[str, Any]:
    """``--set recovery=false`` (short for ``recovery.enabled=false``) or ``recovery={...}``."""
    try:
        return {"enabled": parse_value(text, bool)}
    except ConfigError:
        pass
    value = _loose_value(text)
    if not isinstance(value, dict):
        raise ConfigError(f"{head} expects true/false or a JSON dict of its settings (or {head}.<setting>=...), got {text!r}")
    return value

