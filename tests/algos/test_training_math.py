"""Training math of the loop (issue 27 items 5-8): schedules per group, each loss term over
its own units, turn-level returns of tool segments, and the KL diagnostics that move."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.advantages import turn_level_advantages  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.optim import CRITIC_KEY, lr_factor  # noqa: E402

SCHEDULE = dict(lr_scheduler="linear", warmup_steps=1, steps=4)


def grpo(**kw):
    kw = {k: v for k, v in echo_kwargs(**kw).items() if k not in ("critic_lr", "recovery")}
    return GRPOTrainer(GRPOConfig(group_size=2, **kw), policy=letter_policy(mode=kw.get("mode", "lora")))


def marft(**kw):
    return MARFTActionTrainer(MARFTActionConfig(**echo_kwargs(**kw)), policy=letter_policy())


@pytest.mark.parametrize("make, extra, groups", [
    (grpo, {}, ["speaker", "listener"]),
    (grpo, {"mode": "shared", "num_minibatches": 2}, ["speaker"]),  # one optimizer stepped twice per minibatch round
    (marft, {"agent_by_agent": True}, ["speaker", "listener", CRITIC_KEY]),  # the critic steps once per agent minibatch
], ids=["lora", "shared", "marft-agent-by-agent"])
def test_every_group_follows_the_schedule_of_the_training_step(make, extra, groups):
    t = make(**SCHEDULE, **extra)
    base = {k: t.optimizers[k].defaults["lr"] for k in groups}
    for k in range(4):
        t.train_step()
        for key in groups:  # the step-k update ran at factor(k), whatever the group's own step count
            want = base[key] * lr_factor(k, warmup=1, total=4, kind="linear")
            assert t.optimizers[key].param_groups[0]["lr"] == pytest.approx(want), (key, k)
    assert t.optimizers[groups[-1]].param_groups[0]["lr"] > 0  # decay reaches 0 only at `steps`


def test_ippo_value_loss_is_a_mean_over_actions_under_micro_batches():
    # actions of several tokens: a value loss weighted by tokens across pieces would give the
    # value heads another gradient than the whole minibatch's
    kw = echo_kwargs(recovery=None, sampling_overrides={"speaker": {"max_new_tokens": 3}, "listener": {"max_new_tokens": 5}})
    kw = {k: v for k, v in kw.items() if k != "recovery"}
    whole = IPPOTrainer(IPPOConfig(**kw), policy=letter_policy())
    whole.train_step()
    pieces = IPPOTrainer(IPPOConfig(**dict(kw, micro_batch_tokens=1)), policy=letter_policy())
    pieces.train_step()
    lengths = {len(t.response_ids) for t in pieces.last_batch.transitions}
    assert len(lengths) > 1  # the test needs actions of different lengths
    for a in whole.agents:
        for p, q in zip(whole.algorithm.value_parameters(a), pieces.algorithm.value_parameters(a), strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_tool_segments_of_one_action_are_one_turn():
    # one action in three segments, the reward on the last: every segment's return is the
    # action's (before: 0.25 / 0.5 / 1.0 at gamma 0.5)
    _, G = turn_level_advantages([0, 0, 1], ["a", "a", "a"], gamma=0.5, normalize="none", action_ids=[(0, 0)] * 3)
    assert G.tolist() == [1.0, 1.0, 1.0]
    _, G = turn_level_advantages([0, 0, 1], ["a", "a", "a"], gamma=0.5, normalize="none", action_ids=[(0, 0), (1, 0), (1, 0)])
    assert G.tolist() == [0.5, 1.0, 1.0]  # the next action is the next turn: discounted


def test_kl_diagnostics_move_at_the_defaults():
    # one epoch, one minibatch: the in-loss KL is 0 by construction; the post-update KL and,
    # at the next step, the KL to the reference move once the policy has moved
    t = grpo(lr=0.05)
    history = [t.train_step() for _ in range(4)]
    assert history[0]["agent/speaker/rollout_ref_kl"] == pytest.approx(0.0, abs=1e-7)  # the first batch: policy = reference
    moved = [(k, a) for k, m in enumerate(history[:-1]) for a in t.agents if m[f"agent/{a}/update_kl"] > 1e-6]
    assert moved, "no update moved a policy in 3 steps"
    for k, a in moved:
        assert history[k][f"agent/{a}/kl"] < 1e-9
        assert history[k + 1][f"agent/{a}/rollout_ref_kl"] > 1e-6


def test_collapse_detector_watches_the_post_update_kl():
    from marft_algos.config import RecoveryConfig
    from marft_algos.recovery import CollapseDetector

    d = CollapseDetector(RecoveryConfig(kl_max=0.5, warmup=0), ["a"])
    assert d.check({"agent/a/kl": 0.0, "agent/a/update_kl": 0.7}) == ["kl_spike/a"]
    assert d.check({"agent/a/kl": 0.9, "agent/a/update_kl": 0.1}) == []


# ---- what a user's program and a silent team look like in a run (issue 28 items 16, 18) ----


def _program_team(program, **kw):
    from marft_envs.tasks.base import GradeResult
    from marft_envs.workflow import ProblemList, make_workflow_env

    problems = ProblemList(["Say yes.", "Say no."], lambda text, problem: GradeResult(correct="yes" in text, score=1.0))
    cfg = GRPOConfig(**{**{k: v for k, v in echo_kwargs(**kw).items() if k not in ("critic_lr", "recovery", "env_kwargs", "sampling_overrides")},
                        "env_id": "workflow-example-v0", "group_size": 2})
    return GRPOTrainer(cfg, policy=letter_policy(("writer",)), env_fn=lambda: make_workflow_env(program, ["writer"], problems=problems))


async def _fails(team, problem):
    reply = await team.call("writer", problem.question)
    return float(int(reply))  # a model's reply is rarely an int: ValueError


def test_program_errors_are_counted_printed_and_kept_in_transcripts(caplog, tmp_path):
    t = _program_team(_fails, out_dir=str(tmp_path / "run"), transcript_every=1)
    with caplog.at_level("WARNING", logger="marft"):
        m = t.train_step()
        t.train_step()
    assert m["rollout/program_errors"] == 4.0 and t.counters["rollout/program_errors_total"] == 8.0
    assert caplog.text.count("First traceback") == 1 and "ValueError" in caplog.text  # printed once, in full
    assert caplog.text.count("episodes ended with a program error") == 2  # a summary per step
    t.logger.flush()
    transcript = (tmp_path / "run" / "transcripts.jsonl").read_text()
    assert "ValueError" in transcript and "int(reply)" in transcript


def test_strict_programs_stop_at_the_first_error():
    from marft_algos.callbacks import ProgramError

    t = _program_team(_fails, strict_programs=True)
    with pytest.raises(ProgramError, match="ValueError"):
        t.train_step()


def test_a_step_without_signal_is_counted_and_warned(caplog):
    async def same(team, problem):
        await team.call("writer", problem.question)
        return 1.0  # every episode scores alike

    t = _program_team(same)
    with caplog.at_level("WARNING", logger="marft"):
        m = t.train_step()
    assert m["train/frac_reward_zero_std"] == 1.0 and "no learning signal" in caplog.text
