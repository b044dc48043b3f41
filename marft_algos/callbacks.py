"""Loop callbacks: what a run does around its steps, outside the collect -> estimate -> update phases.

The trainer calls each callback's hooks in order (SB3's callbacks, in the shape of this
loop):

- ``on_train_start(trainer)``: before the first step of :meth:`Trainer.train`;
- ``on_collect_start(trainer)`` and ``on_batch(trainer, batch)``: around the collect phase;
- ``on_step_end(trainer, metrics, batch)``: inside :meth:`Trainer.train_step`, after the
  update and before the step's metrics are logged (they may add metrics);
- ``on_run_step(trainer, metrics)``: in :meth:`Trainer.train`'s loop after each step
  (checkpoints, fault injection);
- ``on_train_end(trainer)`` after a run that ended normally, ``close(trainer)`` always.

A callback with a ``state_key`` has its ``state_dict()`` saved in the trainer's checkpoint
under that key (and restored by ``load_state_dict``). The built-in ones:
:class:`ProgramErrors`, :class:`Transcripts`, :class:`PeriodicCheckpoint`,
:class:`FinalArtifacts`, :class:`FaultHook`; collapse recovery (:class:`marft_algos.recovery.CollapseRecovery`) and
self-play (:class:`marft_algos.selfplay.SelfPlay`) are callbacks too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marft_algos.plotting import plot_learning_curve

__all__ = [
    "Callback",
    "FaultHook",
    "FinalArtifacts",
    "PeriodicCheckpoint",
    "ProgramError",
    "ProgramErrors",
    "Transcripts",
    "default_callbacks",
    "program_errors",
]


class Callback:
    """Base class: every hook does nothing."""

    #: key of this callback's state in the trainer's checkpoint (None: it keeps none)
    state_key: str | None = None

    def on_train_start(self, trainer: Any) -> None:
        """Before the first step of :meth:`Trainer.train`."""

    def on_collect_start(self, trainer: Any) -> None:
        """Before the collect phase of a step."""

    def on_batch(self, trainer: Any, batch: Any) -> None:
        """After the collect phase (``batch.metrics`` may be extended)."""

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """After the update of a step, before its metrics are logged."""

    def on_run_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        """In :meth:`Trainer.train`'s loop, after each step."""

    def on_train_end(self, trainer: Any) -> None:
        """After the last step of a :meth:`Trainer.train` that ended normally."""

    def close(self, trainer: Any) -> None:
        """When :meth:`Trainer.train` returns or raises."""

    def state_dict(self) -> dict[str, Any]:
        """This callback's checkpointed state (with a ``state_key``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any] | None, parts: frozenset[str]) -> None:
        """Restore :meth:`state_dict` (``None``: the checkpoint has none) when the checkpoint
        ``parts`` being loaded include this callback's (``progress``, unless it says otherwise)."""


class Transcripts(Callback):
    """``transcripts_per_step`` episodes to transcripts.jsonl every ``transcript_every`` steps
    (and at step 1, so a short run shows one early); the run's last step always ends with them."""

    def __init__(self) -> None:
        self.written_at = -1
        self.last_batch: Any = None

    def write(self, trainer: Any, batch: Any) -> None:
        """Append the first episodes of ``batch`` (prompts included)."""
        trainer.logger.log_transcripts(trainer.global_step, batch.episodes[: trainer.config.transcripts_per_step])
        self.written_at = trainer.global_step

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Every ``transcript_every`` steps, and at step 1."""
        self.last_batch = batch
        every = trainer.config.transcript_every
        if trainer.logger is not None and every and (trainer.global_step % every == 0 or trainer.global_step == 1):
            self.write(trainer, batch)

    def on_train_end(self, trainer: Any) -> None:
        """The last step's, unless they were just written."""
        if trainer.logger is not None and self.last_batch is not None and trainer.config.transcript_every and self.written_at != trainer.global_step:
            self.write(trainer, self.last_batch)


class ProgramError(RuntimeError):
    """A user program raised during an episode and ``strict_programs`` is on."""


def program_errors(batch: Any) -> list[str]:
    """The traceback (or error text) of each episode of ``batch`` whose program raised."""
    out = []
    for ep in batch.episodes:
        failed = [t for t in ep.transitions if "program_error" in t.flags]
        if failed or "program_error" in (ep.info.get("flags") or []):
            info = failed[-1].info if failed else ep.info
            out.append(str(info.get("program_traceback") or info.get("error") or "(no traceback recorded)"))
    return out


class ProgramErrors(Callback):
    """Episodes whose user program raised (workflow and program envs): counted per step
    (``rollout/program_errors``, and ``..._total``), the first traceback printed in full and
    a one-line summary per step with errors; with ``strict_programs`` the run stops there."""

    def __init__(self) -> None:
        self.shown = False

    def on_batch(self, trainer: Any, batch: Any) -> None:
        """Count, print, or stop."""
        errors = program_errors(batch)
        batch.metrics["rollout/program_errors"] = float(len(errors))
        if not errors:
            return
        trainer.counters["rollout/program_errors_total"] += len(errors)
        step = trainer.global_step + 1
        if trainer.config.strict_programs:
            raise ProgramError(f"step {step}: the program raised (strict_programs=True):\n{errors[0]}")
        log = logging.getLogger("marft")
        if not self.shown:
            log.warning("step %d: the program raised; its episodes train on reward 0. First traceback:\n%s", step, errors[0])
            self.shown = True
        last = errors[0].strip().splitlines()[-1] if errors[0].strip() else ""
        log.warning("step %d: %d of %d episodes ended with a program error (%s)", step, len(errors), len(batch.episodes), last)


class PeriodicCheckpoint(Callback):
    """An atomic checkpoint every ``save_every`` steps (runs with an ``out_dir``)."""

    def on_run_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        """Save when the step is a multiple of ``save_every``."""
        c = trainer.config
        if c.out_dir and c.save_every and trainer.global_step % c.save_every == 0:
            trainer.save_checkpoint()


class FinalArtifacts(Callback):
    """At the end of a run with an ``out_dir``: the last checkpoint and the learning-curve plot."""

    def on_train_end(self, trainer: Any) -> None:
        """Save the last step and draw the learning curve."""
        c = trainer.config
        if not c.out_dir:
            return
        trainer.save_checkpoint()
        if c.plot and trainer.logger is not None:
            plot_learning_curve(trainer.logger.metrics_path, Path(c.out_dir) / "learning_curve.png")


class FaultHook(Callback):
    """Calls ``fault(point, step)`` at named points of a run: the crash tests kill a run there.

    ``point`` is ``"step"`` after each step (logged, not yet saved); checkpoint writing has
    its own points (``save:policy`` ...; :func:`marft_algos.checkpoint.save_checkpoint` takes
    the same function).
    """

    def __init__(self, fault: Callable[[str, int], None]) -> None:
        self.fault = fault

    def on_run_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        """The ``step`` point: logged, not yet saved."""
        self.fault("step", trainer.global_step)


#: environment variable of the crash tests: ``POINT:STEP`` pauses a run there (see :func:`env_fault`)
FAULT_ENV = "MARFT_TEST_PAUSE_AT"


def pause_at(point: str, step: int) -> None:
    """Stop here for good when ``$MARFT_TEST_PAUSE_AT == "<point>@<step>"`` (the crash tests
    then kill the process with SIGKILL); writes the pid to ``$MARFT_TEST_PAUSE_AT_FILE`` first."""
    if os.environ.get(FAULT_ENV) != f"{point}@{step}":
        return
    marker = os.environ.get(FAULT_ENV + "_FILE")
    if marker:
        Path(marker).write_text(f"{os.getpid()}\n")
    while True:
        time.sleep(1)


def env_fault() -> Callable[[str, int], None] | None:
    """The crash tests' fault (:func:`pause_at`) when ``$MARFT_TEST_PAUSE_AT`` asks for one, else None."""
    return pause_at if os.environ.get(FAULT_ENV) else None


def default_callbacks(fault: Callable[[str, int], None] | None = None) -> list[Callback]:
    """Transcripts, the fault hook (if any), periodic checkpoints, and the final checkpoint and
    plot (``on_train_end`` runs in this order)."""
    out: list[Callback] = [ProgramErrors(), Transcripts()]
    if fault is not None:
        logging.getLogger("marft").info("fault hook armed")
        out.append(FaultHook(fault))  # before the periodic checkpoint: "step" is logged, not yet saved
    return out + [PeriodicCheckpoint(), FinalArtifacts()]
