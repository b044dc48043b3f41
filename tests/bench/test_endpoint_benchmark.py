"""benchmarks/endpoint.py: episodes/s as concurrent programs grow, beside the built-in env (issue 29).

Real parts: the tiny model, the real loopback endpoint, real ``openai`` clients.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.bench import load_benchmark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("endpoint")


def test_episodes_per_second_at_each_concurrency_beside_the_built_in_env(bench: ModuleType, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "endpoint.json"
    rows = bench.main(["--model", "tiny-random", "--concurrency", "1,4", "--repeats", "1", "--max-new-tokens", "4",
                       "--out", str(out)])
    assert [(r["path"].split(" ")[0], r["episodes"]) for r in rows] == [
        ("built-in", 1), ("endpoint", 1), ("ratio", 1), ("built-in", 4), ("endpoint", 4), ("ratio", 4)]
    for r in rows:
        assert r["status"] == "ok" and r["episodes_s"] > 0 and r["samples_s"] > 0
    for base, prog, ratio in (rows[:3], rows[3:]):
        assert base["failed"] == 0 and prog["failed"] == 0  # every program episode ran to its answer
        assert ratio["episodes_s"] == pytest.approx(prog["episodes_s"] / base["episodes_s"])
    assert rows[0]["scaling"] == 1.0 and rows[1]["scaling"] == 1.0
    assert rows[4]["scaling"] == pytest.approx(rows[4]["episodes_s"] / rows[1]["episodes_s"])
    saved = json.loads(out.read_text())
    assert saved["rows"] == rows and len(saved["loadavg"]) == 3
    text = capsys.readouterr().out
    assert "episodes/s vs the first K" in text and text.count("| endpoint (ProgramEnv + AsyncOpenAI) |") == 2


def test_a_spent_budget_lists_the_remaining_concurrencies_as_not_measured(bench: ModuleType,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench.main(["--model", "tiny-random", "--concurrency", "1,64", "--repeats", "1", "--max-new-tokens", "2",
                       "--budget-minutes", "0"])
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "not measured", "not measured"]
    assert all(r["episodes"] == 64 for r in rows[3:]) and "budget" in rows[3]["reason"]
    assert "| 64 | not measured (budget of 0 s spent)" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["", "0,4", "a,b"])
def test_bad_concurrency_says_what_to_give(bench: ModuleType, bad: str) -> None:
    with pytest.raises(SystemExit, match="positive integers, e.g. 1,4,16,64"):
        bench.main(["--concurrency", bad])
