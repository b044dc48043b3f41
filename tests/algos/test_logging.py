"""Metrics logger (JSONL + TensorBoard), transcripts and the learning-curve plot."""

from __future__ import annotations

import json
import math

import pytest

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
    from marft_algos.plotting import TOKENS_PANEL, curve_panels

    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 4):
        row = {"team/reward": 0.1 * step, "team/accuracy": 0.1 * step, "team/tokens_per_episode": 30.0 + step,
               "agent/a/update_kl": 1e-5 * step, "agent/b/update_kl": 2e-5, "agent/a/kl": 0.0, "agent/a/entropy": 2.0, "agent/a/reward/format": 0.5}
        if step in (1, 3):
            row.update({"eval/accuracy": 0.2 * step, "eval/ci_low": 0.1 * step, "eval/ci_high": 0.3 * step})
        log.log(step, row)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    panels = dict(curve_panels(rows))
    # KL and entropy never share an axis; reward components are not mistaken for diagnostics
    # the in-loss KL (0 by construction at the defaults) is not plotted; the post-update KL is
    assert panels["per-agent update_kl"] == ["agent/a/update_kl", "agent/b/update_kl"] and panels["per-agent entropy"] == ["agent/a/entropy"]
    assert panels["held-out accuracy (95% interval)"] == ["eval/accuracy"]
    assert panels[TOKENS_PANEL] == ["team/tokens_per_episode"] and panels["team reward"] == ["team/reward", "team/accuracy"]
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


# --------------------------------------------------------------------------------------
# the learning-curve figure (issue 28 item 23): integer ticks, no empty axis, grad-norm,
# zero-signal and user cost panels
# --------------------------------------------------------------------------------------


def _axis(fig, title):
    found = [ax for ax in fig.axes if ax.get_title() == title]
    assert len(found) == 1, [ax.get_title() for ax in fig.axes]
    return found[0]


@pytest.mark.parametrize("steps", [1, 2, 3, 7])
def test_learning_curve_ticks_are_whole_steps_on_short_runs(steps):
    import matplotlib.pyplot as plt

    from marft_algos.plotting import learning_curve_figure

    rows = [{"step": s, "team/reward": 0.5, "agent/a/kl": 1e-4 * s} for s in range(1, steps + 1)]
    fig = learning_curve_figure(rows)
    fig.canvas.draw()
    try:
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
            assert set(range(1, steps + 1)) <= {int(t) for t in ticks}  # every step of a short run is a tick
    finally:
        plt.close(fig)


def test_learning_curve_has_no_empty_axis_and_grad_norm_and_zero_signal_panels():
    import matplotlib.pyplot as plt

    from marft_algos.plotting import ZERO_SIGNAL_PANEL, learning_curve_figure

    rows = [{"step": s, "team/reward": 0.1 * s, "agent/a/grad_norm": 0.3, "agent/b/grad_norm": 0.2,
             "train/frac_reward_zero_std": 0.25 * s, "agent/a/kl": float("nan")} for s in range(1, 4)]
    fig = learning_curve_figure(rows)  # 3 panels with data; a NaN-only metric gets none
    try:
        assert len(fig.axes) == 3 and all(ax.has_data() for ax in fig.axes)
        grad = _axis(fig, "per-agent grad_norm")
        assert sorted(line.get_label() for line in grad.get_lines()) == ["agent/a/grad_norm", "agent/b/grad_norm"]
        zero = _axis(fig, ZERO_SIGNAL_PANEL)
        assert list(zero.get_lines()[0].get_ydata()) == [0.25, 0.5, 0.75]
    finally:
        plt.close(fig)
    rows = [{"step": s, "team/reward": 0.1 * s, "team/tokens_per_episode": 9.0, "agent/a/update_kl": 0.1,
             "agent/a/entropy": 1.0} for s in range(1, 4)]
    fig = learning_curve_figure(rows)  # 4 panels in a 3-column grid: the two spare cells are removed
    try:
        assert len(fig.axes) == 4 and all(ax.has_data() for ax in fig.axes)
    finally:
        plt.close(fig)


def test_learning_curve_cost_panel_takes_the_users_own_cost_components():
    import matplotlib.pyplot as plt

    from marft_algos.plotting import COST_PANEL, curve_panels, learning_curve_figure

    rows = [{"step": s, "team/reward": 1.0, "team/reward/outcome": 1.0 * (s % 2),  # a gain, not a cost
             "team/reward/chars": 0.0,  # a built-in cost at weight 0: nothing to show
             "team/reward/tokens": -0.02 * s,  # a built-in cost in force (negative)
             "team/reward/latency": -0.5,  # a user program's own component: negative weight
             "team/reward/api_cost": 0.0 if s == 1 else -0.1,  # "cost" in its name
             "team/reward/wait": 0.3,  # positive, but the user marks it as a cost
             "team/reward/bonus": 0.2} for s in range(1, 4)]
    assert dict(curve_panels(rows))[COST_PANEL] == ["team/reward/tokens", "team/reward/latency", "team/reward/api_cost"]
    assert dict(curve_panels(rows, cost_components=["wait"]))[COST_PANEL] == [
        "team/reward/tokens", "team/reward/latency", "team/reward/api_cost", "team/reward/wait"]
    fig = learning_curve_figure(rows)
    try:
        lines = {line.get_label(): list(line.get_ydata()) for line in _axis(fig, COST_PANEL).get_lines()}
        assert lines["latency"] == [0.5, 0.5, 0.5]  # drawn as a positive cost
        assert lines["tokens"] == pytest.approx([0.02, 0.04, 0.06])
    finally:
        plt.close(fig)
