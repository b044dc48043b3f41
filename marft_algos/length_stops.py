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
"""

from __future__ import annotations

from marft_algos.records import RolloutBatch

__all__ = ["mask_length_stops"]


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
