"""Issue 28 item 24/15: each step logs its own peak memory and thread count under ``perf/``."""

from __future__ import annotations

import gc

import pytest
import torch

from marft_algos.perf_stats import PerfStats, peak_rss_mb, reset_peak_rss

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402


def test_peak_is_per_window_after_a_reset():
    if not reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs: the peak is the process's")
    big = torch.ones(400 * 2**20 // 4)  # 400 MB, touched
    high = peak_rss_mb()
    del big
    gc.collect()
    assert reset_peak_rss()
    assert peak_rss_mb() < high - 300  # the freed 400 MB no longer count


def test_a_training_step_logs_peak_rss_and_threads():
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    kw = echo_kwargs(num_envs=4, group_size=2, steps=1)
    for key in ("critic_lr", "recovery"):
        kw.pop(key)
    trainer = GRPOTrainer(GRPOConfig(**kw), policy=letter_policy(), callbacks=[PerfStats()])
    m = trainer.train_step()
    assert 50 < m["perf/peak_rss_mb"] < 64_000
    assert m["perf/threads"] == torch.get_num_threads()
    # the KL diagnostics' forwards (kl_sample actions, before and after the update) are timed inside the update
    assert 0 < m["perf/kl_diagnostics_s"] <= m["perf/update_s"]
    assert m["agent/speaker/update_kl"] >= 0  # the diagnostics ran (kl_sample > 0 by default)


def test_phase_threads_switch_and_restore(monkeypatch):
    from marft_algos.threads import available_cores, phase_threads, threads_for, torch_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with phase_threads("collect") as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    assert threads_for("update") == min(2, available_cores())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a user's pin wins over the default
    assert threads_for("update") == 1
    assert threads_for("update", 3) == 3  # an explicit setting wins over both
    with pytest.raises(ValueError, match="unknown phase"):
        threads_for("decode")
    with phase_threads("collect", device="cuda" if torch.cuda.is_available() else "meta") as n:
        assert n == torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError
    assert torch.get_num_threads() == before


def test_perf_threads_reports_the_count_in_force():
    from marft_algos.threads import phase_threads, torch_threads

    metrics: dict[str, float] = {}
    with torch_threads(1):
        PerfStats().on_step_end(None, metrics, None)
    assert metrics["perf/threads"] == 1.0
    with phase_threads("update", 2):
        pass
    PerfStats().on_step_end(None, metrics, None)
    assert metrics["perf/threads_update"] == 2.0
