"""Self-play for two-player games: shared seats, or a learner against a pool of its past selves.

Three set-ups, from the simplest:

* **Both seats, one adapter** (``mode="shared"``): an ordinary trainer on a game env.
  Each seat is credited with its own reward (``reward_source`` resolves to ``"agent"``
  for games, see :mod:`marft_algos.reward_source`), so the adapter learns from the
  winner's and the loser's side of every game. Nothing from this module is needed.
* **Both seats, own adapters** (``mode="lora"``): two learners training against each other.
* **A learner against an opponent pool** (:class:`SelfPlay`, ``mode="lora"``): the
  learner seat trains; the opponent seat's adapter is never trained and, before every
  batch, is loaded with a frozen snapshot of the learner drawn from an
  :class:`OpponentPool`; every ``snapshot_every`` steps the learner's adapter is added to
  the pool (the pool starts with the untrained learner). The pool is part of the trainer's
  checkpoint, so a resumed run draws the same opponents.

A frozen seat is a seat the trainer leaves out of its update (``Trainer.skip_update``),
the same idea as a ``frozen_agents`` setting: the two compose (a seat frozen either way is
not trained). The opponent is drawn per batch (one opponent adapter slot); evaluation
against scripted players is :mod:`marft_algos.evaluation.games`.

Example::

    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer
    from marft_algos.selfplay import SelfPlaySettings, selfplay_trainer

    Trainer = selfplay_trainer(GRPOTrainer)
    t = Trainer(GRPOConfig(env_id="game-nim-v0", mode="lora", ...),
                selfplay=SelfPlaySettings(learner="player_0", snapshot_every=5))
    t.train()
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marft_algos.callbacks import Callback
from marft_algos.config import ConfigError

__all__ = ["OpponentPool", "SelfPlay", "SelfPlaySettings", "selfplay_trainer"]

_SAMPLERS = ("uniform", "latest")


@dataclass
class SelfPlaySettings:
    """Settings of a learner-versus-pool run (see the module docstring)."""

    learner: str = field(default="player_0", metadata={"help": "The seat that trains."})
    opponent: str = field(default="player_1", metadata={"help": "The frozen seat, played by snapshots from the pool."})
    snapshot_every: int = field(default=1, metadata={"help": "Add the learner's adapter to the pool every K training steps."})
    pool_size: int = field(default=8, metadata={"help": "Most snapshots kept; the oldest after the first (the untrained learner) is dropped."})
    sample: str = field(default="uniform", metadata={"help": "'uniform' over the pool, or 'latest' (always the newest snapshot)."})
    seed: int = field(default=0, metadata={"help": "Seeds the opponent draws."})

    def __post_init__(self) -> None:
        if self.learner == self.opponent:
            raise ConfigError(f"learner and opponent must be different seats, both are {self.learner!r}")
        if self.snapshot_every < 1:
            raise ConfigError(f"snapshot_every must be >= 1, got {self.snapshot_every}")
        if self.pool_size < 1:
            raise ConfigError(f"pool_size must be >= 1, got {self.pool_size}")
        if self.sample not in _SAMPLERS:
            raise ConfigError(f"sample must be one of {_SAMPLERS}, got {self.sample!r}")


class OpponentPool:
    """Frozen snapshots of a learner's adapter, keyed by the training step they were taken at.

    Args:
        max_size: most snapshots kept; when full, the oldest one after the first is
            dropped (the untrained policy stays: a learner must keep beating it).
        sample: ``"uniform"`` or ``"latest"``.
        seed: seeds the draws (the generator's state is part of :meth:`state_dict`).
    """

    def __init__(self, max_size: int = 8, sample: str = "uniform", seed: int = 0) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if sample not in _SAMPLERS:
            raise ValueError(f"sample must be one of {_SAMPLERS}, got {sample!r}")
        self.max_size = int(max_size)
        self.sample_mode = sample
        self.rng = np.random.default_rng(seed)
        self.snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []

    def __len__(self) -> int:
        return len(self.snapshots)

    @property
    def steps(self) -> list[int]:
        """The training steps of the snapshots in the pool, oldest first."""
        return [s for s, _ in self.snapshots]

    def add(self, step: int, state: dict[str, torch.Tensor]) -> None:
        """Add a snapshot (CPU copies of ``state``), dropping the oldest non-first one when full."""
        self.snapshots.append((int(step), {k: v.detach().cpu().clone() for k, v in state.items()}))
        while len(self.snapshots) > self.max_size:
            del self.snapshots[1 if self.max_size > 1 else 0]

    def draw(self) -> tuple[int, dict[str, torch.Tensor]]:
        """One snapshot ``(step, state)``: uniform over the pool, or the latest."""
        if not self.snapshots:
            raise RuntimeError("the opponent pool is empty: add a snapshot first")
        if self.sample_mode == "latest":
            return self.snapshots[-1]
        return self.snapshots[int(self.rng.integers(len(self.snapshots)))]

    def state_dict(self) -> dict[str, Any]:
        """Snapshots, settings and the draw generator's state (checkpointed with the trainer)."""
        return {
            "max_size": self.max_size,
            "sample": self.sample_mode,
            "rng": self.rng.bit_generator.state,
            "snapshots": [(s, dict(sd)) for s, sd in self.snapshots],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.max_size = int(state["max_size"])
        self.sample_mode = str(state["sample"])
        self.rng.bit_generator.state = state["rng"]
        self.snapshots = [(int(s), dict(sd)) for s, sd in state["snapshots"]]


class SelfPlay(Callback):
    """Learner-versus-pool self-play as a loop callback (see module docstring).

    :meth:`attach` checks the seats and starts the pool with the untrained learner; before
    every collect an opponent drawn from the pool is loaded into the frozen seat (left out
    of the update); every ``snapshot_every`` steps the learner joins the pool. Adds the
    metrics ``selfplay/opponent_step`` and ``selfplay/pool_size``; the pool is checkpointed.
    """

    state_key = "selfplay"

    def __init__(self, settings: SelfPlaySettings | None = None) -> None:
        self.settings = settings or SelfPlaySettings()
        self.pool = OpponentPool(self.settings.pool_size, self.settings.sample, self.settings.seed)
        self.opponent_step: int | None = None

    def attach(self, trainer: Any) -> None:
        """Check that both seats exist on different adapters; the untrained learner joins the pool."""
        sp, agents, policy = self.settings, trainer.agents, trainer.policy
        for seat in (sp.learner, sp.opponent):
            if seat not in agents:
                raise ConfigError(f"self-play seat {seat!r} is not an agent of the env {agents}")
        adapter_of = getattr(policy, "adapter_of", None)
        if getattr(policy, "mode", "lora") != "lora" or (adapter_of and adapter_of(sp.learner) == adapter_of(sp.opponent)):
            raise ConfigError(
                "an opponent pool needs the seats on different adapters: use mode='lora' "
                "(mode='shared' is plain self-play: both seats train one adapter, no pool needed)"
            )
        trainer.skip_update.add(sp.opponent)  # a frozen seat: never trained
        self.pool.add(0, policy.adapter_state_dict(sp.learner))

    def on_collect_start(self, trainer: Any) -> None:
        """Load an opponent drawn from the pool into the frozen seat."""
        step, state = self.pool.draw()
        trainer.policy.load_adapter_state_dict(self.settings.opponent, state)
        self.opponent_step = step

    def on_batch(self, trainer: Any, batch: Any) -> None:
        """The opponent's step and the pool's size, as metrics."""
        batch.metrics["selfplay/opponent_step"] = float(self.opponent_step or 0)
        batch.metrics["selfplay/pool_size"] = float(len(self.pool))

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Every ``snapshot_every`` steps the learner joins the pool."""
        if trainer.global_step % self.settings.snapshot_every == 0:
            self.pool.add(trainer.global_step, trainer.policy.adapter_state_dict(self.settings.learner))

    def state_dict(self) -> dict[str, Any]:
        """The pool and the current opponent."""
        return {"settings": dataclasses.asdict(self.settings), "pool": self.pool.state_dict(), "opponent_step": self.opponent_step}

    def load_state_dict(self, state: dict[str, Any] | None, parts: frozenset[str] = frozenset({"progress"})) -> None:
        """Restore :meth:`state_dict` (a resumed run draws the same opponents)."""
        if state is None:
            raise ValueError("this checkpoint has no opponent pool (it was not written by a self-play trainer)")
        self.pool.load_state_dict(state["pool"])
        self.opponent_step = state["opponent_step"]


@functools.cache
def selfplay_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` whose constructor takes ``selfplay=`` (:class:`SelfPlaySettings`) and
    runs the :class:`SelfPlay` callback (one class per trainer class); ``t.selfplay`` is the callback.

    Example:
        >>> from marft_algos.algos.grpo import GRPOTrainer
        >>> selfplay_trainer(GRPOTrainer).__name__
        'SelfPlayGRPOTrainer'
    """

    def __init__(self: Any, config: Any, *, selfplay: SelfPlaySettings | None = None, callbacks: Any = (), **kwargs: Any) -> None:
        self.selfplay = SelfPlay(selfplay)
        trainer_cls.__init__(self, config, callbacks=[self.selfplay, *callbacks], **kwargs)
        self.selfplay.attach(self)

    return type(f"SelfPlay{trainer_cls.__name__}", (trainer_cls,), {"__init__": __init__, "__doc__": SelfPlay.__doc__})
