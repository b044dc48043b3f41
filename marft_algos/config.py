"""Training configurations: one dataclass per algorithm (TRL style).

Every field carries ``metadata={"help": ...}``; the CLI builds its flags and its
``--set key=value`` parser from these dataclasses, so a new field is a new flag.
``__post_init__`` rejects invalid combinations at start with a reason; settings that
name agents are checked against the environment's agents by :meth:`TrainConfig.check_agents`
when the trainer is built (the config alone does not know the team).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marft_algos.registry import algorithm_name

__all__ = [
    "ConfigError",
    "TrainConfig",
    "GRPOConfig",
    "IPPOConfig",
    "config_from_dict",
    "config_to_dict",
    "apply_overrides",
    "parse_value",
]


class ConfigError(ValueError):
    """An invalid configuration; the message says which setting and why."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


class _AlgorithmName:
    """``Config.algo``: the name the registry knows the config's algorithm by (None for a shared base)."""

    def __get__(self, obj: Any, owner: type) -> str | None:
        return algorithm_name(owner)


_DTYPE_NAMES = frozenset({"bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float"})


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
    activation_checkpointing: bool = field(default=False, metadata={"help": "Recompute each decoder layer in the backward pass instead of storing its activations: a training step's memory stops growing with tokens x layers (about one more forward of cost; training forwards then skip prefix sharing)."})
    release_freed_memory: bool = field(default=False, metadata={"help": "CPU/glibc: pin malloc's mmap and trim thresholds at 128 KiB so memory freed between the phases of a step goes back to the OS (lower peak RSS, slower steps; process-wide; see marft_algos.memory)."})
    max_context: int = field(default=2048, metadata={"help": "Max prompt+response tokens; longer prompts are counted (rollout/overlong) and not trained on."})
    sampling_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": "{agent: {temperature, top_p, max_new_tokens, stop}} over the profile's train sampling."})
    eval_sampling_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": "{agent: {...}} over the profile's eval sampling."})
    # --- optimisation ------------------------------------------------------------
    steps: int = field(default=50, metadata={"help": "Training steps (collect -> advantages -> update)."})
    max_minutes: float | None = field(default=None, metadata={"help": "Stop after this many minutes of training (checked between steps)."})
    lr: float = field(default=1e-5, metadata={"help": "Learning rate of every agent's policy parameters."})
    lr_per_agent: dict[str, float] = field(default_factory=dict, metadata={"help": "{agent: lr} overriding `lr` per agent."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    lr_scheduler: str = field(default="constant", metadata={"help": "'constant' or 'linear' decay to 0 at `steps`, both after `warmup_steps`."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps (optimizer steps, per agent)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (per agent); <= 0 disables clipping."})
    init_loss_scale: float = field(default=2.0**16, metadata={"help": "fp16 only: initial dynamic loss scale (halved on an overflow, doubled after 2000 clean steps)."})
    ppo_epochs: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    num_minibatches: int = field(default=1, metadata={"help": "Minibatches per agent per epoch."})
    # --- logging / checkpoints ---------------------------------------------------
    out_dir: str | None = field(default=None, metadata={"help": "Run directory (metrics, transcripts, checkpoints, plot)."})
    log_every: int = field(default=1, metadata={"help": "Write metrics every N steps."})
    transcript_every: int = field(default=10, metadata={"help": "Save sample transcripts every N steps (0 = never)."})
    transcripts_per_step: int = field(default=2, metadata={"help": "Episodes written per transcript dump."})
    save_every: int = field(default=0, metadata={"help": "Checkpoint every N steps (0 = only at the end)."})
    keep_checkpoints: int = field(default=2, metadata={"help": "Checkpoints kept on disk (the newest ones)."})
    tensorboard: bool = field(default=True, metadata={"help": "Also write TensorBoard events."})
    progress: bool = field(default=True, metadata={"help": "Show a tqdm progress bar with the live team reward."})
    plot: bool = field(default=True, metadata={"help": "Write learning_curve.png at the end."})

    #: the registered name of this config's algorithm (from the registry, never restated here)
    algo = _AlgorithmName()
    #: fields whose dict keys are agent names (validated by check_agents)
    per_agent_fields: typing.ClassVar[tuple[str, ...]] = (
        "model_per_agent",
        "sampling_overrides",
        "eval_sampling_overrides",
        "lr_per_agent",
    )

    def __post_init__(self) -> None:
        _check(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}")
        _check(self.steps >= 0, f"steps must be >= 0, got {self.steps}")
        _check(self.mode in ("lora", "shared", "full"), f"mode must be 'lora', 'shared' or 'full', got {self.mode!r}")
        _check(self.lr > 0 and math.isfinite(self.lr), f"lr must be a positive finite number, got {self.lr}")
        for agent, lr in self.lr_per_agent.items():
            _check(lr > 0 and math.isfinite(lr), f"lr_per_agent[{agent!r}] must be positive, got {lr}")
        _check(self.lr_scheduler in ("constant", "linear"), f"lr_scheduler must be 'constant' or 'linear', got {self.lr_scheduler!r}")
        _check(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        _check(self.num_minibatches >= 1, f"num_minibatches must be >= 1, got {self.num_minibatches}")
        _check(self.max_context >= 8, f"max_context must be >= 8 tokens, got {self.max_context}")
        _check(self.lora_r >= 1, f"lora_r must be >= 1, got {self.lora_r}")
        _check(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")
        _check(self.init_loss_scale > 0 and math.isfinite(self.init_loss_scale), f"init_loss_scale must be a positive finite number, got {self.init_loss_scale}")
        _check(self.max_minutes is None or self.max_minutes > 0, f"max_minutes must be > 0, got {self.max_minutes}")
        # The sampler runs without dropout, so the new log-probs must too (else every PPO
        # ratio and KL carries dropout-mask noise): a LoRA dropout would never be applied.
        _check(
            self.lora_dropout == 0,
            f"lora_dropout must be 0 for RL training, got {self.lora_dropout}: log-probs are computed without dropout, "
            "exactly like the sampled ones, so that the PPO ratio compares the same function",
        )
        if self.dtype is not None:
            key = str(self.dtype).lower().removeprefix("torch.")
            _check(key in _DTYPE_NAMES, f"unknown dtype {self.dtype!r}; use one of {sorted(_DTYPE_NAMES)} or None")
        for name in ("sampling_overrides", "eval_sampling_overrides"):
            for agent, sp in getattr(self, name).items():
                _check(isinstance(sp, dict), f"{name}[{agent!r}] must be a dict of sampling settings")
                unknown = set(sp) - {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "greedy"}
                _check(not unknown, f"{name}[{agent!r}]: unknown sampling settings {sorted(unknown)}")
                _check(sp.get("temperature", 1.0) >= 0, f"{name}[{agent!r}]: temperature must be >= 0")
                _check(0 < sp.get("top_p", 1.0) <= 1, f"{name}[{agent!r}]: top_p must be in (0, 1]")
                _check(sp.get("max_new_tokens", 1) >= 1, f"{name}[{agent!r}]: max_new_tokens must be >= 1")

    # --- helpers -----------------------------------------------------------------
    def check_agents(self, agents: list[str] | tuple[str, ...]) -> None:
        """Reject per-agent settings that name agents the environment does not have."""
        known = set(agents)
        for name in self.per_agent_fields:
            unknown = sorted(set(getattr(self, name)) - known)
            _check(not unknown, f"{name} names unknown agents {unknown}; the environment's agents are {list(agents)}")

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


@dataclass
class GRPOConfig(TrainConfig):
    """Group Relative Policy Optimisation for a team (one adapter per agent by default).

    G env copies reset with the same seed share a problem; each agent's action is
    credited with its episode's team return, normalised within the group (globally
    over all agents of the group, or agent-wise as in Dr. MAS).
    """

    group_size: int = field(default=4, metadata={"help": "G: samples (episodes) per problem; must divide num_envs."})
    normalize: str = field(default="global", metadata={"help": "Advantage normalisation: 'global' (one baseline per group), 'agent' (per group and agent, Dr. MAS) or 'none' (mean only)."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide group-centred rewards by their std (False = Dr. GRPO)."})
    reward_source: str = field(default="team", metadata={"help": "'team': every action gets the episode's team return; 'agent': the sum of the agent's own rewards."})
    eps_low: float = field(default=0.2, metadata={"help": "Lower PPO clip range (ratio >= 1 - eps_low)."})
    eps_high: float = field(default=0.28, metadata={"help": "Upper PPO clip range (DAPO clip-higher; ratio <= 1 + eps_high)."})
    dynamic_sampling: bool = field(default=False, metadata={"help": "DAPO dynamic sampling: drop groups whose rewards are all equal and resample."})
    max_resample_tries: int = field(default=3, metadata={"help": "Extra collection rounds to fill the batch when dynamic sampling drops groups."})
    loss_agg: str = field(default="token", metadata={"help": "'token' (mean over all tokens of the batch) or 'sequence' (mean per sequence, then over sequences)."})
    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference policy (the base with adapters disabled; with mode='full' the frozen initial weights); 0 disables it."})

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.group_size >= 2, f"GRPO needs group_size >= 2 (a group-relative baseline of one sample is 0), got {self.group_size}")
        _check(self.num_envs % self.group_size == 0, f"num_envs ({self.num_envs}) must be a multiple of group_size ({self.group_size})")
        _check(self.normalize in ("global", "agent", "none"), f"normalize must be 'global', 'agent' or 'none', got {self.normalize!r}")
        _check(self.reward_source in ("team", "agent"), f"reward_source must be 'team' or 'agent', got {self.reward_source!r}")
        _check(0 <= self.eps_low < 1, f"eps_low must be in [0, 1), got {self.eps_low}")
        _check(self.eps_high >= self.eps_low, f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low}) (clip-higher widens the upper range)")
        _check(self.loss_agg in ("token", "sequence"), f"loss_agg must be 'token' or 'sequence', got {self.loss_agg!r}")
        _check(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        _check(self.max_resample_tries >= 0, f"max_resample_tries must be >= 0, got {self.max_resample_tries}")


@dataclass
class IPPOConfig(TrainConfig):
    """Independent PPO: each agent is its own PPO learner with its own value head.

    Value heads sit on the frozen base model (one per agent); GAE runs over each
    agent's own transitions only, no chaining across agents.
    """

    gamma: float = field(default=0.99, metadata={"help": "Discount between an agent's consecutive actions (turns)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    team_reward: bool = field(default=True, metadata={"help": "Credit each action with its turn's team reward (False: the agent's own reward)."})
    eps_low: float = field(default=0.2, metadata={"help": "Lower PPO clip range."})
    eps_high: float = field(default=0.2, metadata={"help": "Upper PPO clip range."})
    loss_agg: str = field(default="token", metadata={"help": "'token' or 'sequence' loss aggregation."})
    normalize_advantages: bool = field(default=True, metadata={"help": "Normalise advantages per agent within the batch."})
    value_lr: float = field(default=1e-4, metadata={"help": "Learning rate of the value heads."})
    vf_coef: float = field(default=1.0, metadata={"help": "Value loss coefficient."})
    value_loss: str = field(default="mse", metadata={"help": "'mse' or 'huber'."})
    value_clip: float | None = field(default=None, metadata={"help": "Clip value predictions around the rollout values (None = off)."})
    ent_coef: float = field(default=0.0, metadata={"help": "Entropy bonus coefficient."})
    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference policy (the base with adapters disabled; with mode='full' the frozen initial weights); 0 disables it."})

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 <= self.gamma <= 1, f"gamma must be in [0, 1], got {self.gamma}")
        _check(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        _check(0 <= self.eps_low < 1, f"eps_low must be in [0, 1), got {self.eps_low}")
        _check(self.eps_high >= self.eps_low, f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low})")
        _check(self.loss_agg in ("token", "sequence"), f"loss_agg must be 'token' or 'sequence', got {self.loss_agg!r}")
        _check(self.value_lr > 0, f"value_lr must be > 0, got {self.value_lr}")
        _check(self.value_loss in ("mse", "huber"), f"value_loss must be 'mse' or 'huber', got {self.value_loss!r}")
        _check(self.value_clip is None or self.value_clip > 0, f"value_clip must be > 0 or None, got {self.value_clip}")
        _check(self.beta >= 0, f"beta must be >= 0, got {self.beta}")


# --- (de)serialisation and overrides ---------------------------------------------------


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """JSON-safe dict of a config, with its algorithm name under ``"algo"``."""
    data = dataclasses.asdict(config)
    data["algo"] = config.algo
    return data


def config_from_dict(cls: type[TrainConfig], data: dict[str, Any]) -> TrainConfig:
    """Build ``cls`` from a dict; unknown keys are an error that lists the valid ones."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"algo"})
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings {unknown}; valid settings: {sorted(names)}")
    return cls(**{k: v for k, v in data.items() if k != "algo"})


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
    # dicts / lists: JSON
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"expected JSON for a {annotation}, got {text!r} ({e})") from None
    return value


def apply_overrides(cls: type[TrainConfig], base: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to a dict of settings for ``cls``.

    ``key`` may be dotted into a dict field (``sampling_overrides.actor.temperature=0.7``).
    Unknown keys raise :class:`ConfigError` with a suggestion.
    """
    import difflib

    types = _field_types(cls)
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
        for part in rest[:-1]:
            node[part] = dict(node.get(part, {}))
            node = node[part]
        node[rest[-1]] = leaf
    return out
