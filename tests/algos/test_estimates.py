"""Estimator outputs live in the batch's typed store, never in ``Transition.extras``.

``Transition.extras`` is the collector's (the chat prompt for transcripts). After a
rollout, advantage estimation and a full update of every built-in algorithm on the tiny
model, each transition's extras are exactly what the collector wrote, and the
old / reference log-probs, token-level fields and cached critic features are in
``batch.estimates``.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import ONE_TOKEN, SHAPED, echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402

PLAIN = dict(env_id="echo-duo-v0", env_kwargs=SHAPED, model="tiny-random", num_envs=4, steps=1, progress=False,
             tensorboard=False, sampling_overrides=ONE_TOKEN, beta=0.05)

# algorithm -> (trainer, its config, the store fields every trainable action must have)
ALGOS = {
    "grpo": (GRPOTrainer, lambda: GRPOConfig(group_size=2, **PLAIN), {"old_logp", "ref_logp"}),
    "ippo": (IPPOTrainer, lambda: IPPOConfig(**PLAIN), {"old_logp", "ref_logp", "critic_features"}),
    "marft-action": (MARFTActionTrainer, lambda: MARFTActionConfig(**echo_kwargs(beta=0.05)),
                     {"old_logp", "ref_logp", "critic_features"}),
    "marft-token": (MARFTTokenTrainer, lambda: MARFTTokenConfig(**echo_kwargs(beta=0.05)),
                    {"old_logp", "ref_logp", "critic_features", "token_values", "token_advantages", "token_returns"}),
}


@pytest.mark.parametrize("algo", list(ALGOS))
def test_estimators_and_update_leave_extras_to_the_collector(algo):
    trainer_cls, config, fields = ALGOS[algo]
    t = trainer_cls(config(), policy=letter_policy())
    batch = t.collect()
    trainable = [x for x in batch.transitions if x.trainable]
    assert trainable
    collected = [copy.deepcopy(x.extras) for x in batch.transitions]
    assert all(set(e) == {"prompt"} for e in collected)  # what the collector writes
    t.estimate(batch)
    t.update(batch)
    assert [x.extras for x in batch.transitions] == collected  # no estimator, no update wrote there
    for x in trainable:
        est = batch.estimates.get(x)
        assert est is not None, algo
        have = {f for f in ("old_logp", "ref_logp", "critic_features", "token_values", "token_advantages",
                            "token_returns") if getattr(est, f) is not None}
        assert have == fields, (algo, have)
        assert len(est.old_logp) == len(est.ref_logp) == len(x.response_ids)
