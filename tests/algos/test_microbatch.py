"""Micro-batches (``micro_batch_tokens``): the pieces of one minibatch give its gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.config import ConfigError
from marft_algos.microbatch import micro_batch_rows

pytest.importorskip("marft_algos.models")
from helpers import marft_echo, tiny_echo  # noqa: E402

from marft_algos.algos.grpo import GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402


@given(st.lists(st.integers(1, 50), max_size=30), st.integers(0, 200), st.booleans(), st.integers(1, 4))
def test_pieces_cover_every_row_once_within_the_cap(lengths, cap, grouped, n_groups):
    groups = [i % n_groups for i in range(len(lengths))] if grouped else None
    pieces = micro_batch_rows(lengths, cap, groups)
    assert sorted(i for p in pieces for i in p) == list(range(len(lengths)))
    assert all(pieces)
    for p in pieces:
        units = {groups[i] for i in p} if groups else set(p)
        if cap > 0 and len(units) > 1:  # a piece over the cap holds one unit that cannot be split
            assert len(p) * max(lengths[i] for i in p) <= cap
    if groups:  # a group is never split over pieces
        where = {}
        for k, p in enumerate(pieces):
            for i in p:
                assert where.setdefault(groups[i], k) == k
    if cap <= 0:
        assert len(pieces) <= 1


def _grpo():
    return GRPOTrainer, tiny_echo.echo_config(GRPOConfig, group_size=2, num_envs=8), tiny_echo.letter_policy
def _ippo():
    return IPPOTrainer, tiny_echo.echo_config(IPPOConfig, num_envs=8), tiny_echo.letter_policy
def _marft_action():
    return MARFTActionTrainer, MARFTActionConfig(**marft_echo.echo_kwargs(num_envs=8)), marft_echo.letter_policy
def _marft_token():
    return MARFTTokenTrainer, MARFTTokenConfig(**marft_echo.echo_kwargs(num_envs=8)), marft_echo.letter_policy


def trained(trainer) -> list[torch.Tensor]:
    """Every parameter an optimizer of ``trainer`` steps (adapters, value heads, critic), copied."""
    seen: dict[int, torch.Tensor] = {}
    for opt in trainer.optimizers.values():
        for group in opt.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p.detach().clone())
    return list(seen.values())


@pytest.mark.parametrize("setup", [_grpo, _ippo, _marft_action, _marft_token], ids=["grpo", "ippo", "marft-action", "marft-token"])
def test_micro_batches_give_the_whole_minibatch_step(setup):
    """Two steps with every row in its own piece (cap 1 token) end with the weights of the
    one-forward run (same seed, same rollouts), for every algorithm."""
    import dataclasses

    cls, config, policy_fn = setup()
    whole = cls(config, policy=policy_fn())  # one after the other: each trainer seeds the global RNGs
    m_whole = [whole.train_step() for _ in range(2)]
    pieces = cls(dataclasses.replace(config, micro_batch_tokens=1), policy=policy_fn())
    forwards = {"n": 0}
    inner = pieces.policy_term

    def counted(agent, mb):
        forwards["n"] += 1
        return inner(agent, mb)

    pieces.policy_term = counted
    before = trained(pieces)
    m_pieces = [pieces.train_step() for _ in range(2)]
    assert [m["team/reward"] for m in m_whole] == [m["team/reward"] for m in m_pieces]  # the same rollouts
    assert forwards["n"] > 4  # it did run in pieces
    a, b = trained(whole), trained(pieces)
    assert len(a) == len(b) and not all(torch.equal(x, y) for x, y in zip(a, before, strict=True))  # it trained
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    key = f"agent/{whole.agents[-1]}/grad_norm"
    assert m_pieces[-1][key] == pytest.approx(m_whole[-1][key], rel=1e-3)


def test_micro_batch_tokens_is_checked():
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        tiny_echo.echo_config(GRPOConfig, micro_batch_tokens=-2)  # -1 is the default (a cap per device kind)
    with pytest.raises(ConfigError, match="micro-batches"):
        tiny_echo.echo_config(GRPOConfig, micro_batch_tokens=64, distributed={"strategy": "fsdp"}, mode="full")
