"""Metrics logger (JSONL + TensorBoard), transcripts and the learning-curve plot."""

from __future__ import annotations

import json
import math

from marft_algos.logging import MetricsLogger, agent_metric, read_metrics
from marft_algos.plotting import plot_learning_curve
from marft_algos.records import Episode, Transition


def _episode(eid: int) -> Episode:
    ep = Episode(episode_id=eid, group_id=0, seed=1, problem_id="p/1", team_return=1.0, correct=True)
    ep.transitions.append(
        Transition(episode_id=eid, group_id=0, index=0, turn=0, agent="a", prompt_ids=[1, 2], response_ids=[3], sampler_logprobs=[-0.1], text="hi")
    )
    return ep


def test_jsonl_rows_namespaces_and_nonfinite(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=True)
    log.log(1, {"team/reward": 0.5, agent_metric("reasoner", "kl"): 0.01, "train/nonfinite_skips": 0.0})
    log.log(2, {"team/reward": float("nan"), agent_metric("actor", "entropy"): float("inf")})
    log.flush()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["agent/reasoner/kl"] == 0.01
    # JSON has no NaN: non-finite values become null instead of invalid JSON
    assert rows[1]["team/reward"] is None and rows[1]["agent/actor/entropy"] is None
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # strict JSON
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    log.close()


def test_tensorboard_scalars_readable(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path)
    for step in range(1, 4):
        log.log(step, {"team/reward": step / 10, "agent/actor/kl": 0.1 * step})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "team/reward" in acc.Tags()["scalars"]
    vals = [e.value for e in acc.Scalars("team/reward")]
    assert [round(v, 6) for v in vals] == [0.1, 0.2, 0.3]


def test_transcripts_and_truncate_after(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 6):
        log.log(step, {"team/reward": float(step)})
        log.log_transcripts(step, [_episode(step)])
    log.truncate_after(3)  # a resumed run re-logs steps 4, 5
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    tr = [json.loads(x) for x in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    assert [t["step"] for t in tr] == [1, 2, 3]
    assert tr[0]["episode"]["actions"][0]["text"] == "hi"
    log.log(4, {"team/reward": 4.0})  # appending after a truncate keeps working
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]


def test_learning_curve_png(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 11):
        log.log(step, {"team/reward": math.sin(step) ** 2, "agent/a/kl": 0.01 * step, "agent/b/entropy": 1.0})
    out = plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_learning_curve(tmp_path / "missing.jsonl", tmp_path / "none.png") is None


def test_learning_curve_has_one_panel_per_quantity_and_integer_steps(tmp_path):
    from marft_algos.plotting import curve_panels

    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 4):
        row = {"team/reward": 0.1 * step, "team/accuracy": 0.1 * step, "team/tokens_per_episode": 30.0 + step,
               "agent/a/kl": 1e-5 * step, "agent/b/kl": 2e-5, "agent/a/entropy": 2.0, "agent/a/reward/format": 0.5}
        if step in (1, 3):
            row.update({"eval/accuracy": 0.2 * step, "eval/ci_low": 0.1 * step, "eval/ci_high": 0.3 * step})
        log.log(step, row)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    panels = dict(curve_panels(rows))
    # KL and entropy never share an axis; reward components are not mistaken for diagnostics
    assert panels["per-agent kl"] == ["agent/a/kl", "agent/b/kl"] and panels["per-agent entropy"] == ["agent/a/entropy"]
    assert panels["held-out accuracy (95% interval)"] == ["eval/accuracy"]
    assert panels["cost"] == ["team/tokens_per_episode"] and panels["team reward"] == ["team/reward", "team/accuracy"]
    out = plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_metrics_hold_reward_components_and_route_rates():
    from marft_algos.rollout import component_and_route_metrics

    def ep(eid, hops, comps):
        e = Episode(episode_id=eid, group_id=0, seed=1)
        for k, agent in enumerate(hops):
            info = {"reward_components": comps} if k == len(hops) - 1 else {}
            e.transitions.append(Transition(eid, 0, k, 0, agent, [1], [2], [-0.1], info=info))
        return e

    m = component_and_route_metrics([
        ep(0, ["router", "math"], {"outcome": 1.0, "format": 0.1}),
        ep(1, ["router", "code"], {"outcome": 0.0, "format": 0.1, "cost": -0.2}),
        ep(2, ["router", "math"], {"outcome": 1.0, "format": 0.0}),
    ])
    assert m["route/router->math"] == 2 / 3 and m["route/router->code"] == 1 / 3
    assert m["team/reward/outcome"] == 2 / 3 and m["team/reward/cost"] == -0.2 / 3
    assert m["agent/math/reward/outcome"] == 1.0 and m["agent/code/reward/cost"] == -0.2
    assert "agent/router/reward/outcome" not in m  # the router's own steps were not graded


def test_a_two_step_run_writes_transcripts_with_prompts_at_step_1_and_at_the_end(tmp_path):
    import pytest

    pytest.importorskip("marft_algos.models")
    from helpers.marft_echo import echo_kwargs, letter_policy

    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    kw = echo_kwargs(out_dir=str(tmp_path), steps=2, transcript_every=10, group_size=2)
    kw.pop("recovery"), kw.pop("critic_lr")
    t = GRPOTrainer(GRPOConfig(**kw), policy=letter_policy())
    t.train()
    tr = [json.loads(x) for x in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in tr}) == [1, 2]
    action = tr[0]["episode"]["actions"][0]
    assert action["agent"] == "speaker" and any("vocabulary" in m["content"].lower() for m in action["prompt"])
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert "team/reward/outcome" in rows[0] and "route/speaker->listener" in rows[0]
