"""Metrics logger (JSONL + TensorBoard), transcripts and the learning-curve plot."""

from __future__ import annotations

import json
import math

from marft_algos.logging import MetricsLogger, agent_metric, read_metrics
from marft_algos.plotting import plot_learning_curve
from marft_algos.rollout import Episode, Transition


def _episode(eid: int) -> Episode:
    ep = Episode(episode_id=eid, group_id=0, seed=1, problem_id="p/1", team_return=1.0, correct=True)
    ep.transitions.append(
        Transition(episode_id=eid, group_id=0, index=0, turn=0, agent="a", prompt_ids=[1, 2], response_ids=[3], old_logprobs=[-0.1], text="hi")
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
