"""DAPO's overlong filtering: no policy-gradient signal for actions cut by the token limit.

An action that ran into its ``max_new_tokens`` (``finish_reason == "length"``) was not
finished by the policy; its reward says little about the text that was cut. DAPO (Yu et
al., 2025) masks such samples out of the loss, which keeps a policy from being pushed
towards (or away from) replies that only ended because the budget did. Here the mask is
applied after the algorithm's estimator, so it works for every algorithm alike: the
action's advantage (and, in token-level MARFT, each token's) becomes 0. The critic still
learns the action's value (a truncated reply is a state the team is in), the KL and
entropy terms still apply, and the action still counts in the loss's mean (as an action
of a group without signal does), so the update's scale shrinks with the share masked.

:class:`LengthStopWatch` (on in every run, ``length_stop_warn``) warns when an agent's
share of cut actions (``agent/<a>/length_stop_frac``) stays high: the team reward cannot
show it (measured on arith after an SFT warm start: a MARFT reasoner drifted from 6% to
every reply cut while the team reward hovered), and it is the sign to raise the agent's
``max_new_tokens`` or (MARFT) to whiten the advantages. Measured on that task (three
seeds each; docs/results.md, credit assignment): whitening kept the reasoner within its
limit on every seed, while masking the cut actions did not help over three seeds and made
the drift absorbing on one (once every reply is cut and masked, no gradient pulls the
agent back), so the warning names masking last, with that caveat.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from marft_algos.callbacks import Callback
from marft_algos.records import RolloutBatch

__all__ = ["LengthStopWatch", "mask_length_stops"]

log = logging.getLogger("marft")


def mask_length_stops(batch: RolloutBatch) -> int:
    """Zero the advantages of ``batch``'s actions cut by ``max_new_tokens``; return how many.

    Call it after the estimator filled the advantages. A branching tree's shared action is
    masked once, on its owner (:attr:`RolloutBatch.transitions` leaves the shadows out).
    """
    n = 0
    for t in batch.transitions:
        if t.finish_reason != "length":
            continue
        n += 1
        if t.advantage is not None:
            t.advantage = 0.0
        est = batch.estimates.get(t)
        if est is not None and est.token_advantages is not None:
            est.token_advantages = [0.0] * len(est.token_advantages)
    return n


class LengthStopWatch(Callback):
    """Warn when an agent's actions keep running into their token limit.

    After every step it averages each agent's ``agent/<a>/length_stop_frac`` over the last
    ``window`` steps; when that mean reaches ``config.length_stop_warn`` (0 switches the
    watch off) it warns once, naming the agent, the share, the share over the run's first
    steps (a drift shows as a rise) and the remedies. It warns again only after the
    share fell below half the threshold. Its state travels in checkpoints, so a resumed run
    does not warn twice for the same episode of drift.
    """

    state_key = "length_stop_watch"

    def __init__(self, window: int = 3) -> None:
        self.window = window
        self.recent: dict[str, deque[float]] = {}
        self.first: dict[str, list[float]] = {}
        self.warned: set[str] = set()

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Update each agent's window; warn on a crossing."""
        threshold = trainer.config.length_stop_warn
        if not threshold:
            return
        for agent in trainer.agents:
            frac = metrics.get(f"agent/{agent}/length_stop_frac")
            if frac is None:
                continue
            recent = self.recent.setdefault(agent, deque(maxlen=self.window))
            recent.append(float(frac))
            first = self.first.setdefault(agent, [])
            if len(first) < self.window:
                first.append(float(frac))
            mean = sum(recent) / len(recent)
            if agent in self.warned:
                if mean < threshold / 2:
                    self.warned.discard(agent)
                continue
            if len(recent) == self.window and mean >= threshold:
                self.warned.add(agent)
                log.warning(
                    "step %d: agent %s: %.0f%% of its actions over the last %d steps were cut by its max_new_tokens "
                    "(agent/%s/length_stop_frac; %.0f%% over the run's first %d steps): its reward judges unfinished "
                    "text, which the team reward does not show. Raise its max_new_tokens (sampling_overrides) or, with "
                    "MARFT, whiten the advantages (normalize_advantages=batch; it stopped this drift on arith). "
                    "mask_length_stops=true (DAPO's overlong filtering) takes the cut replies' gradient away, so once "
                    "all are cut nothing pulls the agent back; length_stop_warn=0 silences this.",
                    trainer.global_step, agent, 100 * mean, self.window, agent, 100 * sum(first) / len(first), len(first),
                )

    def state_dict(self) -> dict[str, Any]:
        """The windows, the first steps' shares and the agents warned about."""
        return {"recent": {a: list(q) for a, q in self.recent.items()}, "first": dict(self.first), "warned": sorted(self.warned)}

    def load_state_dict(self, state: dict[str, Any] | None, parts: frozenset[str]) -> None:
        """Restore :meth:`state_dict` (a checkpoint without it: start afresh)."""
        if not state:
            return
        self.recent = {a: deque(v, maxlen=self.window) for a, v in state["recent"].items()}
        self.first = {a: list(v) for a, v in state["first"].items()}
        self.warned = set(state["warned"])
