"""Collapse recovery: detect a training collapse and roll back to the last good checkpoint.

The MARFT paper's remedy for a collapsed run is manual: stop, reload an earlier
checkpoint, lower the learning rate, continue. :class:`CollapseRecovery` automates it.

After every training step it reads the step's metrics and checks, against
configurable thresholds (:class:`RecoveryConfig`):

- **non-finite**: the step skipped an optimizer step for a NaN/inf loss or gradient
  (``train/nonfinite_skips`` grew), a monitored metric is NaN/inf, or a trainable
  parameter is no longer finite;
- **entropy surge**: an agent's mean token entropy exceeds ``entropy_factor`` times its
  running baseline (an EMA over healthy steps) *and* the baseline by at least
  ``entropy_min_delta`` nats (or exceeds ``entropy_max`` outright);
- **KL spike**: an agent's KL from the rollout policy to the updated one, measured after the
  update (``agent/<a>/update_kl``), exceeds ``kl_max``, or its KL to the reference
  (``agent/<a>/rollout_ref_kl``, else the loss's ``agent/<a>/ref_kl``) exceeds ``ref_kl_max``.
  (The in-loss ``agent/<a>/kl`` is measured before each minibatch's step: 0 by construction
  with one epoch and one minibatch, so it cannot show a spike at the defaults.)
- **reward collapse**: a fast EMA of ``team/reward`` (the last few steps) falls below
  ``(1 - reward_drop)`` times the run's reference level, once that level is at least
  ``reward_min``, *and* below it by more than ``reward_z`` standard errors of the fast EMA.
  The reference is a slow EMA of the healthy steps' rewards that skips steps already below
  the drop line (so a collapse under way does not drag it down). The standard error is the
  largest a stationary policy at the reference level can have: per episode the
  Bhatia-Davis bound ``(hi - ref)(ref - lo)`` on the variance of a reward in
  ``[reward_low, reward_high]``, divided by the step's independent units and scaled to the
  EMA (``a / (2 - a)`` for weight ``a``). The units are the step's problems
  (``rollout/problems``: a GRPO group's or a branching tree's episodes share one and are
  correlated), else its ``rollout/episodes``. Without that noise test a binary reward over 16
  episodes a step trips a 50% drop of a 0.3 policy several times a run by chance alone (the
  best of a noisy EMA sits well above its mean): rollbacks and learning-rate cuts that are
  noise, not collapse. A step with neither count gets the ratio test only.

Checkpoints: a checkpoint is written (via :mod:`marft_algos.checkpoint`) after each
``every``-th healthy step. Its weights are only *validated* by the NEXT step (the step
that collects and trains with them), so a checkpoint becomes "good" once the following
step is healthy. On a collapse the trainer is rolled back to the last good checkpoint:
policy weights, critic / value heads, optimizer and scheduler states; then every
learning rate is multiplied by ``lr_factor``. The step counter, the problem stream and
the RNG keep running (the run continues on new problems instead of replaying the ones
that collapsed it), and the metrics history is kept (the collapse stays visible). Each
rollback is logged (``recovery/rollbacks``, ``recovery/reason/<reason>``, a warning, and
a ``recovery.jsonl`` line in the run directory). After ``max_rollbacks`` rollbacks a
further collapse restores the last good checkpoint once more (without lowering the learning
rate) and raises :class:`CollapseError`: training stops on the last healthy weights.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from marft_algos.callbacks import Callback
from marft_algos.checkpoint import load_checkpoint, save_checkpoint
from marft_algos.config import RecoveryConfig

__all__ = ["CollapseDetector", "CollapseError", "CollapseRecovery"]

log = logging.getLogger("marft")

#: what a rollback restores from the last good checkpoint (the rest of the run goes on)
ROLLBACK_PARTS = ("weights", "optimizers", "schedulers")


class CollapseError(RuntimeError):
    """A collapse after the allowed number of rollbacks. Raised with the trainer back on the
    last good checkpoint's weights and optimisation state (what a user keeps or evaluates);
    ``step``, ``reasons`` and ``metrics`` are the collapsed step's (its ``rollout/tokens``
    were generated: a token budget counts them)."""

    def __init__(self, message: str, *, step: int | None = None, reasons: list[str] | None = None,
                 metrics: Mapping[str, float] | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.reasons = list(reasons or [])
        self.metrics = dict(metrics or {})


class CollapseDetector:
    """Stateful checks of one step's metrics; baselines only learn from healthy steps."""

    def __init__(self, settings: RecoveryConfig, agents: list[str]) -> None:
        self.s = settings
        self.agents = list(agents)
        self.entropy_baseline: dict[str, float] = {}
        self.reward_ema: float | None = None  # fast: what the last few steps earned
        self.reward_ref: float | None = None  # slow: the level the run had reached
        self.warned_range = False
        self.healthy_steps = 0
        self.last_nonfinite = 0.0

    def state_dict(self) -> dict[str, Any]:
        """Baselines, warm-up count and the last seen skip counter (checkpointed and rolled back)."""
        return {
            "entropy_baseline": dict(self.entropy_baseline),
            "reward_ema": self.reward_ema,
            "reward_ref": self.reward_ref,
            "healthy_steps": self.healthy_steps,
            "last_nonfinite": self.last_nonfinite,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resumed run keeps its baselines and stays armed)."""
        self.entropy_baseline = dict(state["entropy_baseline"])
        self.reward_ema = state["reward_ema"]
        # a checkpoint written before the slow reference existed holds the best fast EMA instead
        ref = state.get("reward_ref", state.get("best_reward_ema"))
        self.reward_ref = None if ref is None or not math.isfinite(ref) else float(ref)
        self.healthy_steps = int(state["healthy_steps"])
        self.last_nonfinite = float(state.get("last_nonfinite", self.last_nonfinite))

    def check(self, metrics: Mapping[str, float], params: list[torch.Tensor] | None = None) -> list[str]:
        """Reasons for a collapse in this step (empty = healthy); updates baselines if healthy."""
        s = self.s
        reasons: list[str] = []
        skips = float(metrics.get("train/nonfinite_skips", self.last_nonfinite))
        if skips > self.last_nonfinite:
            reasons.append("nonfinite")
        self.last_nonfinite = skips
        watched = ["team/reward"] + [f"agent/{a}/{k}" for a in self.agents for k in ("entropy", "update_kl", "rollout_ref_kl", "ref_kl", "loss")]
        if any(k in metrics and not math.isfinite(float(metrics[k])) for k in watched) and "nonfinite" not in reasons:
            reasons.append("nonfinite")
        if params is not None and "nonfinite" not in reasons:
            if not all(bool(torch.isfinite(p).all()) for p in params):
                reasons.append("nonfinite")
        armed = self.healthy_steps >= s.warmup
        entropies: dict[str, float] = {}
        for a in self.agents:
            e = metrics.get(f"agent/{a}/entropy")
            if e is None or not math.isfinite(float(e)):
                continue
            e = float(e)
            entropies[a] = e
            if s.entropy_max is not None and e > s.entropy_max:
                reasons.append(f"entropy_surge/{a}")
                continue
            base = self.entropy_baseline.get(a)
            if armed and s.entropy_factor is not None and base is not None:
                if e > s.entropy_factor * base and e - base > s.entropy_min_delta:
                    reasons.append(f"entropy_surge/{a}")
        for a in self.agents:
            kl = metrics.get(f"agent/{a}/update_kl")
            if s.kl_max is not None and kl is not None and float(kl) > s.kl_max:
                reasons.append(f"kl_spike/{a}")
            rkl = metrics.get(f"agent/{a}/rollout_ref_kl", metrics.get(f"agent/{a}/ref_kl"))
            if s.ref_kl_max is not None and rkl is not None and float(rkl) > s.ref_kl_max:
                reasons.append(f"ref_kl_spike/{a}")
        r = metrics.get("team/reward")
        r = float(r) if r is not None and math.isfinite(float(r)) else None
        new_ema = self.reward_ema
        below = False  # under the drop line: kept out of the reference, a collapse if beyond noise
        if r is not None and not s.reward_low <= r <= s.reward_high and not self.warned_range:
            self.warned_range = True
            log.warning(
                "collapse recovery: team/reward %.4g is outside [recovery.reward_low, recovery.reward_high] = [%g, %g]; "
                "set them to the env's reward range, or the reward-collapse noise test misjudges the noise",
                r, s.reward_low, s.reward_high,
            )
        if r is not None:
            new_ema = r if self.reward_ema is None else s.reward_ema * r + (1 - s.reward_ema) * self.reward_ema
            ref = self.reward_ref
            if armed and s.reward_drop is not None and ref is not None and ref >= s.reward_min:
                below = new_ema < (1 - s.reward_drop) * ref
                units = metrics.get("rollout/problems", metrics.get("rollout/episodes"))
                if below and (s.reward_z is None or ref - new_ema > s.reward_z * self.reward_noise(ref, units)):
                    reasons.append("reward_collapse")
        if not reasons:  # learn baselines from healthy steps only
            self.healthy_steps += 1
            for a, e in entropies.items():
                b = self.entropy_baseline.get(a)
                self.entropy_baseline[a] = e if b is None else s.baseline_ema * e + (1 - s.baseline_ema) * b
            self.reward_ema = new_ema
            if r is not None and not below:
                self.reward_ref = r if self.reward_ref is None else s.reward_ref_ema * r + (1 - s.reward_ref_ema) * self.reward_ref
        return reasons

    def reward_noise(self, ref: float, units: float | None) -> float:
        """The largest standard deviation of the fast reward EMA under a stationary policy
        whose mean reward is ``ref``, over ``units`` independent units a step (0 if unknown).

        The units are the step's problems where the rollout names them (``rollout/problems``):
        a GRPO group or a branching tree shares its problem, and the mean reward of one
        problem's episodes is itself in ``[reward_low, reward_high]``, so the bound holds
        for it."""
        s = self.s
        if not units or units <= 0:
            return 0.0
        mean = min(max(ref, s.reward_low), s.reward_high)
        var_episode = (s.reward_high - mean) * (mean - s.reward_low)  # Bhatia-Davis bound
        a = s.reward_ema
        return math.sqrt(var_episode / float(units) * a / (2 - a))


class CollapseRecovery(Callback):
    """Detect collapses after each step and roll the trainer back (see module docstring);
    a loop callback (:mod:`marft_algos.callbacks`): it saves the starting point before the
    first step's collect, checks each step before its metrics are logged, and forgets its
    checkpoints when the run ends.

    Args:
        trainer: a :class:`marft_algos.trainer.Trainer` (uses ``save_checkpoint``-compatible
            state: ``policy.save/load``, ``state_dict``/``load_state_dict``, optimizers,
            schedulers, ``counters``, ``history``, ``logger``).
        settings: thresholds and actions.
        root: where recovery checkpoints go (default ``<out_dir>/recovery``, or a
            temporary dir removed by :meth:`close` when the run has no ``out_dir``).
    """

    def __init__(self, trainer: Any, settings: RecoveryConfig, root: str | Path | None = None) -> None:
        self.trainer = trainer
        self.s = settings
        self.detector = CollapseDetector(settings, trainer.agents)
        out_dir = getattr(trainer.config, "out_dir", None)
        self._tmp: str | None = None
        if root is None:
            if out_dir:  # several ranks: each keeps its own copy (identical states, no shared writes)
                dist = getattr(trainer, "dist", None)
                root = Path(out_dir) / "recovery" / (f"rank-{dist.rank}" if dist is not None and dist.active else "")
            else:
                self._tmp = tempfile.mkdtemp(prefix="marft-recovery-")
                # removed by close(), or when this object is collected (train_step-only use)
                weakref.finalize(self, shutil.rmtree, self._tmp, True)
                root = self._tmp
        self.root = Path(root)
        # (checkpoint dir, {detector state, lr scale}) of the last good / the unvalidated one
        self.good: tuple[Path, dict[str, Any]] | None = None
        self.pending: tuple[Path, dict[str, Any]] | None = None
        self.rollbacks: list[dict[str, Any]] = []

    state_key = "recovery"

    # ---- loop hooks ---------------------------------------------------------------------
    def on_collect_start(self, trainer: Any) -> None:
        """The starting weights are the first good checkpoint."""
        if self.good is None:
            self.start()

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Check the step (it may roll back and add ``recovery/*`` metrics)."""
        self.after_step(metrics)

    # ---- state (part of the trainer's checkpoint: a resumed run does not re-arm) ---------
    def state_dict(self) -> dict[str, Any]:
        """The detector's state and the rollbacks so far (they count towards ``max_rollbacks``)."""
        return {"detector": self.detector.state_dict(), "rollbacks": [dict(e) for e in self.rollbacks]}

    def load_state_dict(self, state: Mapping[str, Any] | None, parts: frozenset[str] = frozenset({"progress"})) -> None:
        """Restore :meth:`state_dict` with the ``progress`` part; the recovery checkpoints themselves start afresh."""
        if state is None or "progress" not in parts:
            return
        self.detector.load_state_dict(state["detector"])
        self.rollbacks = [dict(e) for e in state.get("rollbacks", [])]

    # ---- checkpoints ------------------------------------------------------------------
    def _save(self) -> tuple[Path, dict[str, Any]]:
        path = save_checkpoint(self.trainer, self.root, keep=0)  # we prune ourselves
        return path, {"detector": self.detector.state_dict(), "lr_scale": float(getattr(self.trainer, "lr_scale", 1.0))}

    def _prune(self) -> None:
        keep = {x[0] for x in (self.good, self.pending) if x is not None}
        for p in self.root.glob("step-*"):
            if p not in keep:
                shutil.rmtree(p, ignore_errors=True)

    def start(self) -> None:
        """Save the starting point (the weights before any update count as good)."""
        self.good = self._save()
        self.pending = None

    def _trainable(self) -> list[torch.Tensor]:
        t = self.trainer
        seen: dict[int, torch.Tensor] = {}
        for opt in t.optimizers.values():
            for g in opt.param_groups:
                for p in g["params"]:
                    seen[id(p)] = p
        return list(seen.values())

    # ---- the check ----------------------------------------------------------------------
    def after_step(self, metrics: dict[str, float]) -> bool:
        """Check the step that produced ``metrics``; roll back if it collapsed. Returns True on rollback."""
        if self.good is None:
            self.start()
        reasons = self.detector.check(metrics, self._trainable())
        t = self.trainer
        if not reasons:
            if self.pending is not None:  # the weights of the pending checkpoint just proved healthy
                self.good, self.pending = self.pending, None
            if t.global_step % self.s.every == 0:
                self.pending = self._save()
            self._prune()
            return False
        if len(self.rollbacks) >= self.s.max_rollbacks:
            path, _ = self._restore_good()
            raise CollapseError(
                f"step {t.global_step}: collapse ({', '.join(reasons)}) after {len(self.rollbacks)} rollbacks "
                f"(max_rollbacks={self.s.max_rollbacks}); stopping with the weights of the last good checkpoint "
                f"({path.name})", step=t.global_step, reasons=reasons, metrics=metrics)
        self.rollback(reasons, metrics)
        return True

    def _restore_good(self) -> tuple[Path, dict[str, Any]]:
        """Load the last good checkpoint; returns it (path, saved detector state and lr scale).

        Only the model and its optimisation state go back: the step counter, counters,
        metrics history, problem stream and RNG streams run on (new problems, the collapse
        stays visible in the log), and the rollbacks so far still count."""
        assert self.good is not None
        path, saved = self.good
        load_checkpoint(self.trainer, path, parts=ROLLBACK_PARTS)
        # the detector's baselines as they were at that checkpoint; the skip counter is kept
        self.detector.load_state_dict({**saved["detector"], "last_nonfinite": self.detector.last_nonfinite})
        return path, saved

    def rollback(self, reasons: list[str], metrics: dict[str, float] | None = None) -> None:
        """Restore the last good checkpoint, scale every learning rate by ``lr_factor``."""
        t = self.trainer
        path, saved = self._restore_good()
        lr_scale = getattr(t, "lr_scale", 1.0) * self.s.lr_factor
        # lower every learning rate: the restored states carry the scale in force when they
        # were saved; bring them to the new cumulative scale (schedulers scale from base_lrs)
        factor = lr_scale / saved["lr_scale"]
        t.lr_scale = lr_scale
        for sched in {id(s): s for s in t.schedulers.values()}.values():
            sched.base_lrs = [lr * factor for lr in sched.base_lrs]
        for opt in {id(o): o for o in t.optimizers.values()}.values():
            for g in opt.param_groups:
                g["lr"] *= factor
                if "initial_lr" in g:
                    g["initial_lr"] *= factor
        self.pending = None
        self._prune()
        event = {
            "step": t.global_step,
            "reasons": reasons,
            "restored": path.name,
            "lr_scale": lr_scale,
            "time": time.time(),
        }
        self.rollbacks.append(event)
        t.counters["recovery/rollbacks"] += 1
        for r in reasons:
            t.counters[f"recovery/reason/{r}"] += 1
        if metrics is not None:
            metrics["recovery/rollback"] = 1.0
            metrics["recovery/rollbacks"] = float(t.counters["recovery/rollbacks"])
        log.warning("step %d: collapse detected (%s); rolled back to %s, lr x%g (total scale %g)",
                    t.global_step, ", ".join(reasons), path.name, self.s.lr_factor, lr_scale)
        out_dir = getattr(t.config, "out_dir", None)
        if out_dir and getattr(getattr(t, "dist", None), "is_main", True):
            with open(Path(out_dir) / "recovery.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event) + "\n")

    def close(self, trainer: Any = None) -> None:
        """Forget the checkpoints (a later step starts afresh) and remove a temporary root."""
        self.good = self.pending = None
        if self._tmp is not None:  # a later save re-creates it; the finalizer removes it again
            shutil.rmtree(self._tmp, ignore_errors=True)
