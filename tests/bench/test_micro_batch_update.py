"""benchmarks/micro_batch_update.py on the CPU: one step per cap, the phases' seconds reported."""

from __future__ import annotations

from tests.helpers.bench import load_benchmark


def test_one_step_per_cap_with_its_phase_seconds():
    rows = load_benchmark("micro_batch_update").main(
        ["--device", "cpu", "--model", "tiny-random", "--num-envs", "4", "--group-size", "2", "--max-new-tokens", "4",
         "--steps", "1", "--caps", "0,64"])
    assert [r["micro_batch_tokens"] for r in rows] == [0, 64]
    for r in rows:
        assert 0 < r["perf/update_s"] <= r["perf/step_s"] and 0 < r["perf/generate_s"] <= r["perf/step_s"]
