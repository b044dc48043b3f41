"""Smoke test of benchmarks/games.py on the tiny random model (slow: two trainers, two evaluations)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_games_benchmark_end_to_end(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("_bench_games", REPO / "benchmarks" / "games.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    mod.main(["--model", "tiny-random", "--steps", "1", "--eval-n", "2", "--dialogue-steps", "1", "--max-new-tokens", "4",
              "--num-envs", "4", "--group-size", "2", "--out", str(tmp_path)])
    with (tmp_path / "games.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(mod.COLUMNS)
    nim = [r for r in rows if r["part"] == "nim"]
    # untrained and trained, against two opponents, two seats + all
    assert {(r["system"], r["opponent"], r["seat"]) for r in nim} == {
        (s, o, seat) for s in ("untrained", "self-play GRPO") for o in ("random", "optimal") for seat in ("player_0", "player_1", "all")}
    for r in nim:
        assert float(r["win_lo"]) <= float(r["win_rate"]) <= float(r["win_hi"])
    dialogue = [r for r in rows if r["part"] == "dialogue"]
    assert [r["system"] for r in dialogue] == ["untrained", "GRPO"]
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 and float(r["turns"]) >= 0 for r in dialogue)
    assert (tmp_path / "games.md").is_file() and (tmp_path / "games.json").is_file()
