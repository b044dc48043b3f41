"""The evaluation package: agents from a spec without data, the one Wilson interval, the
untrained team, checkpoints with custom teams in eval / leaderboard / compare, and the
regression view's own-change vs input-change split."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import marft_envs
from marft_algos.evaluation import EvaluationError, wilson, wilson_interval

REPO = Path(__file__).resolve().parents[2]
#: A custom two-agent team file (written by the tests).
# a few tokens per answer: the tiny model's 49k-vocabulary head makes each token cost
_FEW = {"max_new_tokens": 4}
_PAIR = [
    {"role": "writer", "prompt": "Write a short answer.", "sampling": _FEW, "eval_sampling": _FEW},
    {"role": "critic", "prompt": "Check the answer and give the final one.", "with_answer": True, "sampling": _FEW, "eval_sampling": _FEW},
]

# --------------------------------------------------------------------------------------
# no model
# --------------------------------------------------------------------------------------


def _no_data(*args: object, **kwargs: object) -> None:
    raise AssertionError("a data set was loaded")


def test_spec_agents_load_no_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import marft_envs.tasks.gsm8k

    monkeypatch.setattr(marft_envs.data, "load_split", _no_data)
    monkeypatch.setattr(marft_envs.tasks.gsm8k, "load_split", _no_data)
    with pytest.raises(AssertionError, match="data set was loaded"):
        marft_envs.make("gsm8k-duo-v0", split="test")  # building the env would load GSM8K
    assert marft_envs.spec("gsm8k-duo-v0").agents == ["reasoner", "actor"]
    assert marft_envs.spec("math-trio-v0").agents == ["solver_a", "solver_b", "aggregator"]
    assert marft_envs.spec("code-duo-v0").agents == ["planner", "coder"]
    team = tmp_path / "pair.json"
    team.write_text(json.dumps(_PAIR))
    assert marft_envs.spec("gsm8k-duo-v0").agents_for(profiles=str(team), split="test") == ["writer", "critic"]


def test_spec_agents_import_no_task_module() -> None:
    code = (
        "import sys, marft_envs\n"
        "assert marft_envs.spec('gsm8k-duo-v0').agents == ['reasoner', 'actor']\n"
        "assert marft_envs.spec('code-trio-v0').agents == ['planner', 'coder', 'reviewer']\n"
        "loaded = [m for m in ('marft_envs.tasks.gsm8k', 'marft_envs.tasks.code', 'marft_envs.data') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_spec_agents_of_an_entry_point_without_a_team_kwarg() -> None:
    spec = marft_envs.register("evaltest-noteam-v0", lambda **kw: marft_envs.TextTeamEnv(task="echo", profiles="echo"), mirror=False)
    try:
        assert spec.agents == ["speaker", "listener"]  # read from the built env: nothing else can tell
    finally:
        marft_envs.registry.pop("evaltest-noteam-v0")


def test_wilson_is_one_interval() -> None:
    lo, hi = wilson_interval(5, 10)  # hand-computed: centre 0.5, half 1.96 * sqrt(0.025 + 0.0096) / 1.384
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(5, 10) == wilson(0.5, 10)
    assert wilson_interval(0, 7)[0] == 0.0 and wilson_interval(7, 7)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)


def test_eval_refuses_zero_problems(capsys: pytest.CaptureFixture[str]) -> None:
    from marft_algos.cli import main

    assert main(["eval", "--env", "echo-duo-v0", "--model", "tiny-random", "--n", "0"]) == 2
    err = capsys.readouterr().err
    assert "--n must be at least 1" in err and "Traceback" not in err
    from marft_algos.evaluation import evaluate

    with pytest.raises(EvaluationError, match=">= 1"):
        evaluate(None, "echo-duo-v0", n=0)
    with pytest.raises(EvaluationError, match="leaves none"):
        evaluate(None, "echo-duo-v0", n=2, start_index=10_000_000)


# --------------------------------------------------------------------------------------
# tiny model
# --------------------------------------------------------------------------------------

pytest.importorskip("marft_algos.models")

_SHORT = {"writer": {"max_new_tokens": 4}, "critic": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """arith-duo-v0 played by a custom writer/critic team file, GRPO, 1 step, tiny model."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    root = tmp_path_factory.mktemp("pair")
    team = root / "pair.json"
    team.write_text(json.dumps(_PAIR))
    run = root / "run"
    cfg = GRPOConfig(env_id="arith-duo-v0", env_kwargs={"profiles": str(team), "digits": 1}, model="tiny-random", num_envs=2,
                     group_size=2, steps=1, out_dir=str(run), sampling_overrides=_SHORT, progress=False, plot=False,
                     tensorboard=False, transcript_every=0)
    GRPOTrainer(cfg).train()
    return run


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _metric(rows: list[dict[str, str]], agent: str, metric: str) -> float:
    return float(next(r["B"] for r in rows if r["agent"] == agent and r["metric"] == metric))


def test_untrained_team_is_the_base_with_zero_adapters() -> None:
    """The one meaning of 'untrained': the bare base gives exactly a fresh LoRA team's actions."""
    from marft_algos.evaluation import untrained_policy
    from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

    roles = ["reasoner", "actor"]
    bare, lora = untrained_policy(roles, "tiny-random"), TeamPolicy(roles, base="tiny-random")
    prompts = [bare.encode(r, [{"role": "user", "content": f"What is {k} + 2?"}]) for k, r in enumerate(roles)]
    assert prompts == [lora.encode(r, [{"role": "user", "content": f"What is {k} + 2?"}]) for k, r in enumerate(roles)]
    reqs = [GenRequest(r, p, SamplingParams(temperature=0.0, max_new_tokens=12)) for r, p in zip(roles, prompts, strict=True)]
    assert [x.token_ids for x in bare.generate(reqs)] == [x.token_ids for x in lora.generate(reqs)]
    assert not any(n for n, _ in bare._bases[0].model.named_parameters() if "lora" in n)  # no adapters at all


def test_eval_checkpoint_on_another_env_takes_only_its_team(pair_run: Path, tmp_path: Path) -> None:
    """The run had env kwargs (profiles, digits): on another env the team goes with the
    checkpoint, the arith option does not (an echo task rejects 'digits')."""
    from marft_algos.cli import main

    marft_envs.register("evaltest-echo-duo-v0", "marft_envs.text_env:env", kwargs={"task": "echo", "profiles": "duo"}, mirror=False)
    try:
        res = tmp_path / "r.json"
        assert main(["eval", "--checkpoint", str(pair_run), "--env", "evaltest-echo-duo-v0", "--n", "2", "--num-envs", "2",
                     "--greedy", "--json", str(res)]) == 0
        r = json.loads(res.read_text())
        assert r["env_id"] == "evaltest-echo-duo-v0" and r["n"] == 2 and set(r["per_agent_tokens"]) == {"writer", "critic"}
    finally:
        marft_envs.registry.pop("evaltest-echo-duo-v0")
    # its own env: all of its kwargs, the custom team included
    assert main(["eval", "--checkpoint", str(pair_run), "--n", "2", "--num-envs", "2", "--json", str(res)]) == 0
    assert json.loads(res.read_text())["env_id"] == "arith-duo-v0"


def test_checkpoint_on_an_env_without_its_roles_is_a_clear_error(pair_run: Path) -> None:
    """Told to drop its team (env_kwargs={}), the writer/critic checkpoint cannot play echo's
    speaker/listener: an EvaluationError (one line, exit 2 in the CLI) names both lists."""
    from marft_algos.evaluation import evaluate_checkpoint

    with pytest.raises(EvaluationError, match=r"roles \['writer', 'critic'\].*agents \['speaker', 'listener'\]"):
        evaluate_checkpoint(pair_run, "echo-duo-v0", env_kwargs={}, n=2)


def test_leaderboard_compare_and_checkpoint_with_a_custom_team(pair_run: Path, tmp_path: Path) -> None:
    from marft_algos.evaluation import main

    out = tmp_path / "cmp"
    assert main(["--compare", "untrained", str(pair_run), "--limit", "2", "--max-new-tokens", "4", "--out", str(out)]) == 0
    rows = _csv(out / "compare.csv")
    assert {r["agent"] for r in rows} == {"team", "writer", "critic"}
    assert "arith-duo-v0" in (out / "compare.md").read_text()
    lb = tmp_path / "lb"
    assert main(["--model", "tiny-random", "--suite", "arith", "--teams", "duo", "--no-majority", "--limit", "2",
                 "--max-new-tokens", "4", "--checkpoint", f"pair={pair_run}", "--out", str(lb)]) == 0
    trained = [r for r in _csv(lb / "leaderboard.csv") if r["system"] == "trained pair"]
    assert len(trained) == 1 and trained[0]["env_id"] == "arith-duo-v0" and trained[0]["problems"] == "2"
    samples = [json.loads(x) for x in (lb / "samples.jsonl").read_text().splitlines()]
    assert {a["agent"] for s in samples if s["system"] == "trained pair" for a in s["actions"]} == {"writer", "critic"}


def test_suite_file_runs_every_team_unless_teams_selects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from marft_algos.evaluation import SUITES, main

    suites = tmp_path / "suites.json"
    suites.write_text(json.dumps({"toy": {"envs": {"pair": "echo-duo-v0"}, "limit": 2}}))
    common = ["--model", "tiny-random", "--suite-file", str(suites), "--no-majority", "--max-new-tokens", "3"]
    try:
        assert main([*common, "--out", str(tmp_path / "a")]) == 0
        assert [r["system"] for r in _csv(tmp_path / "a" / "leaderboard.csv")] == ["untrained pair"]
        capsys.readouterr()
        assert main([*common, "--teams", "solo", "--out", str(tmp_path / "b")]) == 0
        assert "teams ['pair'] not selected by --teams solo" in capsys.readouterr().out
    finally:
        SUITES.pop("toy", None)


def test_compare_separates_an_agents_own_change_from_its_inputs(tmp_path: Path) -> None:
    """Agent-by-agent MARFT, one update (the entropy bonus moves it even at reward 0): only the
    reasoner moves. The actor's text changes with its inputs, but on frozen inputs it writes
    what the untrained actor wrote."""
    from safetensors.torch import load_file

    from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer
    from marft_algos.evaluation import main

    run = tmp_path / "run"
    short = {"reasoner": {"max_new_tokens": 6}, "actor": {"max_new_tokens": 6}}
    cfg = MARFTActionConfig(env_id="arith-duo-v0", model="tiny-random", num_envs=4, steps=1, out_dir=str(run), lr=0.05, ent_coef=0.1, recovery=False,
                            agent_by_agent=True, sampling_overrides=short, progress=False, plot=False, tensorboard=False,
                            transcript_every=0)
    MARFTActionTrainer(cfg).train()
    adapters = {d.name: load_file(str(d / "adapter_model.safetensors")) for d in (run / "checkpoints").glob("*/policy/adapters/*")}
    assert set(adapters) == {"reasoner", "actor"}, adapters.keys()
    assert all(float(v.abs().max()) == 0.0 for k, v in adapters["actor"].items() if "lora_B" in k)  # the actor never stepped
    assert any(float(v.abs().max()) > 0.0 for k, v in adapters["reasoner"].items() if "lora_B" in k)
    out = tmp_path / "cmp"
    assert main(["--compare", "untrained", str(run), "--limit", "4", "--max-new-tokens", "6", "--out", str(out)]) == 0
    rows = _csv(out / "compare.csv")
    assert _metric(rows, "reasoner", "own_change") > 0.0
    assert _metric(rows, "actor", "own_change") == 0.0  # greedy, same weights, same frozen prompts
    assert _metric(rows, "actor", "input_changed") == _metric(rows, "reasoner", "action_changed") > 0.0
    metrics = {r["metric"] for r in rows if r["agent"] == "team"}
    assert {"reward", "reward/outcome", "cost"} <= metrics


# --------------------------------------------------------------------------------------
# games in the leaderboard
# --------------------------------------------------------------------------------------


def test_leaderboard_reports_win_draw_loss_with_cis_against_fixed_opponents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A game suite gets win/draw/loss rates with Wilson intervals per opponent and seat,
    for the untrained base and a self-play checkpoint: the same numbers as playing the
    games directly, in a table of their own (no accuracy rows, no majority vote)."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer
    from marft_algos.evaluation import evaluate_vs_opponent, main, untrained_policy
    from marft_envs.games import NimEnv, OptimalNimPlayer, RandomPlayer

    nim = {"piles": [5, 8], "on_invalid": "default"}
    run = tmp_path / "run"
    GRPOTrainer(GRPOConfig(env_id="game-nim-v0", env_kwargs=nim, model="tiny-random", mode="shared", num_envs=2, group_size=2,
                           steps=1, lr=0.05, out_dir=str(run), progress=False, plot=False, tensorboard=False, transcript_every=0,
                           sampling_overrides={a: {"max_new_tokens": 2} for a in ("player_0", "player_1")})).train()
    out = tmp_path / "lb"
    common = ["--model", "tiny-random", "--env", "game-nim-v0", "--env-kwargs", f"game-nim-v0={json.dumps(nim)}", "--limit", "6",
              "--max-new-tokens", "2", "--temperature", "0", "--seed", "3"]
    assert main([*common, "--opponent", "random", "--opponent", "optimal", "--checkpoint", f"sp={run}", "--out", str(out)]) == 0
    rows = _csv(out / "leaderboard_games.csv")
    assert list(rows[0])[:6] == ["suite", "system", "env_id", "opponent", "seat", "games"]
    assert [(r["system"], r["opponent"], r["seat"]) for r in rows] == [
        (s, o, seat) for s in ("untrained", "trained sp") for o in ("random", "optimal") for seat in ("player_0", "player_1", "all")]
    assert _csv(out / "leaderboard.csv") == [] and "## Games" in (out / "leaderboard.md").read_text()
    # the numbers are those of the games played directly (same start positions, seeds and opponent)
    direct = {
        name: evaluate_vs_opponent(untrained_policy(["player_0", "player_1"], "tiny-random"), lambda: NimEnv(split="test", **nim),
                                   player, 6, seed=3, sampling={"max_new_tokens": 2})
        for name, player in (("random", RandomPlayer(3)), ("optimal", OptimalNimPlayer()))
    }
    for r in rows:
        if r["system"] != "untrained":
            continue
        want = direct[r["opponent"]]["overall" if r["seat"] == "all" else "seats"]
        want = want if r["seat"] == "all" else want[r["seat"]]
        assert int(r["games"]) == want["n"] == (12 if r["seat"] == "all" else 6)
        for k in ("win", "draw", "loss"):
            assert float(r[f"{k}_rate"]) == pytest.approx(want[f"{k}_rate"])
            assert (float(r[f"{k}_ci_low"]), float(r[f"{k}_ci_high"])) == pytest.approx(wilson_interval(want[k], want["n"]))
        assert float(r["win_rate"]) + float(r["draw_rate"]) + float(r["loss_rate"]) == pytest.approx(1.0)
    assert all(float(r["draw_rate"]) == 0.0 for r in rows)  # Nim has no draws
    games = json.loads((out / "leaderboard.json").read_text())["games"]
    assert len(games) == len(rows) and games[0]["opponent"] == "random"
    # bad input is a one-line error before any model loads
    capsys.readouterr()
    assert main([*common, "--opponent", "perfect", "--out", str(tmp_path / "bad")]) == 2
    assert "unknown opponent 'perfect'" in capsys.readouterr().err
    assert main(["--model", "tiny-random", "--env", "game-matrix-v0", "--opponent", "optimal", "--out", str(tmp_path / "bad")]) == 2
    assert "no optimal player for MatrixGameEnv" in capsys.readouterr().err


class _SearchingGenerator:
    """Char-level ids, no model: the RAG solo generator writes a search call and a call of a
    tool it does not have in one segment, then answers: with the gold for the questions in
    ``golds``, with "nobody" otherwise."""

    def __init__(self, golds: dict[str, str]) -> None:
        self.golds = golds

    def encode(self, role, messages):
        return [ord(c) for c in "\n".join(f"<{m['role']}>{m['content']}" for m in messages)]

    def generate(self, requests):
        from marft_algos.models import GenResult

        out = []
        for r in requests:
            prompt = "".join(chr(i) for i in r.prompt_ids)
            if "<tool>" not in prompt:
                text = ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
                        '<tool_call>{"name": "browse", "arguments": {}}</tool_call>')
            else:
                text = "Answer: " + next((g for q, g in self.golds.items() if q in prompt), "nobody")
            ids = [ord(c) for c in text]
            out += [GenResult(token_ids=ids, text=text, logprobs=[-0.5] * len(ids), finish_reason="eos")] * r.n
        return out


def test_records_keep_the_score_and_the_tool_use_of_every_step() -> None:
    from marft_algos.evaluation import agent_tool_stats, run_samples

    env = marft_envs.make("rag-solo-v0", split="test")
    env.reset(options={"problem_index": 0})
    golds = {env.problem.question: env.problem.answer}
    records = run_samples(_SearchingGenerator(golds), "rag-solo-v0", split="test", problems=[0, 1], temperature=None)
    first, second = records
    assert [(a["segment"], a["tool_calls"], a["tool_errors"]) for a in first.actions] == [(0, 2, ["unknown_tool"]), (1, 0, [])]
    assert first.correct and first.score == 1.0  # the answer F1 of the graded turn
    assert not second.correct and second.score == 0.0
    (row,) = agent_tool_stats(records, ["generator"])
    assert (row["episodes"], row["actions"], row["steps"], row["tool_calls"], row["tool_errors"]) == (2, 1.0, 2.0, 2.0, 1.0)
    assert row["tool_error_rate"] == 0.5 and row["errors_by_kind"] == {"unknown_tool": 2}
    assert row["tokens"] == sum(a["tokens"] for a in first.actions + second.actions) / 2


# --------------------------------------------------------------------------------------
# the compare view's format errors and costs (issue 28 item 23)
# --------------------------------------------------------------------------------------


def _record(actions, components=None, reward=0.0):
    from marft_algos.evaluation.samples import SampleRecord

    acts = [{"agent": a, "text": t, "tokens": 3, "finish": "eos"} for a, t in actions]
    return SampleRecord(problem=0, sample=0, correct=False, tokens=6, calls=len(acts), timed_out=False, answer=None,
                        actions=acts, reward=reward, components=components or {})


def test_compare_reports_format_errors_only_for_roles_that_answer() -> None:
    from marft_algos.evaluation.compare import agent_stats

    # arith-duo: the reasoner thinks aloud (never graded as the answer), the actor answers
    recs = [_record([("reasoner", "let me think about it"), ("actor", "the answer is 7")]),
            _record([("reasoner", "hmm"), ("actor", "no idea")])]
    stats = agent_stats(recs, "arith-duo-v0", "test", {})
    assert "format_error" not in stats["reasoner"]  # not a format error: it never answers
    assert stats["actor"]["format_error"] == 0.5
    assert stats["reasoner"]["tokens"] == 3.0 and "correct_alone" in stats["reasoner"]


def test_compare_cost_counts_the_users_own_cost_components() -> None:
    from marft_algos.evaluation.compare import _team_rows

    def rec(latency, api_cost, chars):
        return _record([("actor", "7")], {"outcome": 1.0, "latency": latency, "api_cost": api_cost, "chars": chars,
                                          "bonus": 0.2}, reward=1.0)

    ra = [rec(-0.5, 0.0, -0.01), rec(-0.5, -0.2, -0.03)]  # cost per episode 0.51, 0.73
    rb = [rec(-0.1, 0.0, 0.0), rec(-0.3, 0.0, -0.02)]  # 0.10, 0.32
    rows = {r["metric"]: r for r in _team_rows(ra, rb)}
    assert rows["cost"]["A"] == pytest.approx(0.62) and rows["cost"]["B"] == pytest.approx(0.21)
    assert rows["reward/latency"]["A"] == pytest.approx(-0.5)  # the component row is kept too


# --------------------------------------------------------------------------------------
# eval and leaderboard agree (issue 28 item 20)
# --------------------------------------------------------------------------------------

_LIMITED = [
    {"role": "writer", "prompt": "Write a short answer.", "eval_sampling": {"max_new_tokens": 3}},
    {"role": "critic", "prompt": "Check the answer and give the final one.", "with_answer": True,
     "eval_sampling": {"max_new_tokens": 2}},
]


def test_eval_and_leaderboard_agree_on_one_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The leaderboard's --max-new-tokens default (256) used to override the profiles' own
    eval limits: 107.5 vs 1,193 tokens/episode on one checkpoint."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer
    from marft_algos.cli import main as marft

    team = tmp_path / "limited.json"
    team.write_text(json.dumps(_LIMITED))
    run = tmp_path / "run"
    kwargs = {"profiles": str(team), "digits": 1}
    GRPOTrainer(GRPOConfig(env_id="arith-duo-v0", env_kwargs=kwargs, model="tiny-random", num_envs=2, group_size=2, steps=1,
                           out_dir=str(run), sampling_overrides=_SHORT, progress=False, plot=False, tensorboard=False,
                           transcript_every=0)).train()
    res = tmp_path / "eval.json"
    assert marft(["eval", "--checkpoint", str(run), "--n", "2", "--greedy", "--json", str(res)]) == 0
    eval_tokens = json.loads(res.read_text())["mean_tokens"]
    lb = tmp_path / "lb"
    assert marft(["leaderboard", "--model", "tiny-random", "--env", "arith-duo-v0", "--env-kwargs", f"arith-duo-v0={json.dumps(kwargs)}",
                  "--no-majority", "--limit", "2", "--temperature", "0", "--checkpoint", f"lim={run}", "--out", str(lb)]) == 0
    trained = [r for r in _csv(lb / "leaderboard.csv") if r["system"] == "trained lim"]
    assert len(trained) == 1
    assert float(trained[0]["tokens_per_episode"]) <= 5  # the profiles' 3 + 2, not 256 per role
    assert float(trained[0]["tokens_per_episode"]) == pytest.approx(eval_tokens)
    assert 0.0 <= float(trained[0]["team_reward"]) <= 1.0 and "team reward" in (lb / "leaderboard.md").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        marft(["leaderboard", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "each profile's own eval limit" in shown and "a checkpoint's own run setting" in shown


class _RamblingDuo:
    """Char-level ids, no model: the reasoner rambles around one claim, the actor boxes 1."""

    RAMBLE = "Let me think about this problem step by step carefully.\nFirst 2 + 2 = 4.\nHmm, that seems right, I think so.\n"

    def encode(self, role, messages):
        return [ord(c) for c in "\n".join(f"<{m['role']}>{m['content']}" for m in messages)]

    def generate(self, requests):
        from marft_algos.models import GenResult

        out = []
        for r in requests:
            text = self.RAMBLE if r.role == "reasoner" else "\\boxed{1}"
            ids = [ord(c) for c in text]
            out += [GenResult(token_ids=ids, text=text, logprobs=[-0.5] * len(ids), finish_reason="eos")] * r.n
        return out


def test_eval_counts_the_prompt_tokens_each_agent_read() -> None:
    """``mean_prompt_tokens`` is the prompt ids per episode; a compact hand-off shortens the actor's prompt only."""
    from marft_algos.evaluation import evaluate
    from marft_envs.handoff import claims_record

    res = {h: evaluate(_RamblingDuo(), "arith-duo-v0", env_kwargs={"handoff": h}, n=3, greedy=True) for h in ("full", "record")}
    for r in res.values():
        assert r.mean_prompt_tokens == sum(len(t.prompt_ids) for ep in r.episodes for t in ep.transitions) / 3
        assert r.to_dict()["per_agent_prompt_tokens"].keys() == {"reasoner", "actor"}
    full, record = res["full"].per_agent_prompt_tokens, res["record"].per_agent_prompt_tokens
    assert record["reasoner"] == full["reasoner"]
    assert full["actor"] - record["actor"] == len(_RamblingDuo.RAMBLE) - len(claims_record(_RamblingDuo.RAMBLE))  # char-level ids
    assert res["record"].mean_prompt_tokens < res["full"].mean_prompt_tokens
