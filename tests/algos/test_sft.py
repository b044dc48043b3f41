"""Per-role SFT warm start (issue 30 item 2): scripted demos built exactly as the rollout
builds prompts, the masked LM loss on assistant tokens only, a run dir that `marft train
--init` and `marft eval` load, and the envs' scripted policies."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import marft_envs
from marft_algos.algos.grpo import GRPOConfig
from marft_algos.config import ConfigError
from marft_algos.policy_factory import make_policy
from marft_algos.sft import (
    Demo,
    SFTConfig,
    _nll,
    demos_from_jsonl,
    response_ids,
    run_sft,
    scripted_demos,
)
from marft_envs import TopologyError

pytest.importorskip("marft_algos.models")


def _policy(env_id, **kw):
    agents = marft_envs.make(env_id, **kw.get("env_kwargs", {})).possible_agents
    return make_policy(GRPOConfig(env_id=env_id, model="tiny-random", device="cpu", **kw), agents)


def _play_scripted(env):
    """Play one episode with the env's scripted policy; the texts per agent, in order."""
    texts = []
    while env.agents:
        a = env.agent_selection
        if env.terminations[a] or env.truncations[a]:
            env.step(None)
            continue
        texts.append((a, env.demo_action()))
        env.step(texts[-1][1])
        if "grade" in env.infos.get(a, {}):
            env.graded = env.infos[a]  # (the infos are gone once the episode ends)
    return texts


@pytest.mark.parametrize("env_id", ["arith-duo-v0", "arith-calc-duo-v0", "arith-solo-v0", "arith-routed-v0", "arith-planner-v0", "rag-solo-v0", "rag-quartet-v0"])
def test_scripted_policies_solve_their_envs(env_id):
    for seed in range(4):
        env = marft_envs.make(env_id)
        env.reset(seed=seed)
        _play_scripted(env)
        assert env.graded["grade"]["correct"], (env_id, seed)


def test_scripted_demos_use_the_tools_and_a_short_reasoning_format():
    env = marft_envs.make("arith-calc-duo-v0")
    env.reset(seed=0)
    texts = _play_scripted(env)
    assert [a for a, _ in texts] == ["reasoner", "actor", "actor"]
    assert "<tool_call>" in texts[1][1] and '"name": "calculator"' in texts[1][1] and env.graded["grade"]["correct"]
    assert texts[2][1] == f"\\boxed{{{env.problem.answer}}}" and len(texts[0][1]) < 80
    env = marft_envs.make("rag-solo-v0")
    env.reset(seed=0)  # a 3-hop question whose view lacks a supporting document: one search
    texts = _play_scripted(env)
    assert '"name": "search"' in texts[0][1] and texts[-1][1] == f"Answer: {env.problem.answer}"
    assert marft_envs.make("echo-duo-v0").task.__class__.__dict__.get("demo_action") is None


@pytest.mark.parametrize("seed", range(3))
def test_an_arith_agent_that_answers_alone_states_the_sum(seed):
    # a bare boxed number taught the solo agent to guess (docs/results.md); one that reads a
    # teammate or the calculator's result still answers with the boxed number only
    for env_id, bare in [("arith-solo-v0", False), ("arith-duo-v0", True), ("arith-calc-solo-v0", True)]:
        env = marft_envs.make(env_id)
        env.reset(seed=seed)
        answer, expr = env.problem.answer, env.problem.meta["expression"]
        last = _play_scripted(env)[-1][1]
        assert last == (f"\\boxed{{{answer}}}" if bare else f"{expr} = {answer}. \\boxed{{{answer}}}"), env_id
        assert env.graded["grade"]["correct"]


def test_scripted_routers_reach_every_role():
    env = marft_envs.make("arith-planner-v0")
    env.reset(seed=0)
    texts = _play_scripted(env)
    assert [a for a, _ in texts] == ["planner", "solver", "planner", "checker", "planner"]
    assert texts[0][1] == "ROUTE: solver" and texts[-1][1].endswith("ROUTE: done") and env.graded["grade"]["correct"]
    env = marft_envs.make("arith-routed-v0")
    env.reset(seed=0)
    assert [a for a, _ in _play_scripted(env)] == ["orchestrator", "algebra"]  # arithmetic is the algebra specialist's
    one_hop = json.loads((Path(marft_envs.__file__).parent / "profiles" / "planner.json").read_text())
    one_hop["topology"]["max_hops"] = 1
    env = marft_envs.make("arith-planner-v0", profiles=one_hop)
    env.reset(seed=0)  # one hop: the planner answers once it is spent, rather than routing past the budget
    texts = _play_scripted(env)
    assert [a for a, _ in texts] == ["planner", "solver", "planner"] and env.graded["grade"]["correct"]
    one_hop["topology"].update(max_hops=3, route_pattern=r"next\s*->\s*(\w+)")
    env = marft_envs.make("arith-planner-v0", profiles=one_hop)
    env.reset(seed=0)
    with pytest.raises(TopologyError, match="pass a route_format"):  # "ROUTE: solver" would not route under it
        env.demo_action()
    one_hop["topology"]["route_format"] = "NEXT -> {}"
    env = marft_envs.make("arith-planner-v0", profiles=one_hop)
    env.reset(seed=0)  # the scripted routes are written in the team's own format
    texts = _play_scripted(env)
    assert [a for a, _ in texts] == ["planner", "solver", "planner", "checker", "planner"]
    assert texts[0][1] == "NEXT -> solver" and texts[-1][1].endswith("\nNEXT -> done") and env.graded["grade"]["correct"]
    demos, stats = scripted_demos(_policy("arith-planner-v0"), lambda: marft_envs.make("arith-planner-v0"), 2, seed=0)
    assert stats["kept"] == 2 and stats["no_demo_roles"] == [] and {d.role for d in demos} == {"planner", "solver", "checker"}


def test_scripted_demo_prompts_are_the_rollout_prompts():
    from marft_envs.tools import continuation_ids

    policy = _policy("arith-calc-duo-v0")
    demos, stats = scripted_demos(policy, lambda: marft_envs.make("arith-calc-duo-v0"), 2, seed=3)
    assert stats["kept"] == 2 and [d.role for d in demos] == ["reasoner", "actor", "actor"] * 2
    tok = policy.tokenizer("actor")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    # replay the first episode by hand: the first segments are the chat-templated env messages
    env = marft_envs.make("arith-calc-duo-v0")
    from marft_algos.rollout import RolloutCollector

    env.reset(seed=RolloutCollector(lambda: env, None, num_envs=1, seed=3).draw_resets(1)[0]["seed"])
    reasoner, call, answer = demos[:3]
    assert reasoner.prompt_ids == policy.encode("reasoner", env.messages("reasoner"))
    env.step(env.demo_action())
    assert call.prompt_ids == policy.encode("actor", env.messages("actor"))
    text = env.demo_action()
    env.step(text)
    assert call.response_ids[-1] == eos and tok.decode(call.response_ids, skip_special_tokens=True) == text
    # the answer after the tool result continues the call's exact ids, as the collector does
    tool_messages = env.infos["actor"]["tool_messages"]
    assert answer.prompt_ids == call.prompt_ids + call.response_ids + list(continuation_ids(tok, call.response_ids, tool_messages))
    assert tok.decode(answer.response_ids, skip_special_tokens=True) == env.demo_action()


def test_scripted_prompts_over_max_context_are_counted_not_lost():
    policy = _policy("arith-calc-duo-v0")
    env_fn = lambda: marft_envs.make("arith-calc-duo-v0")  # noqa: E731
    demos, stats = scripted_demos(policy, env_fn, 2, seed=3, max_context=8)
    # every prompt is over 8 tokens: both agents step with "", the episodes are wrong and dropped
    assert demos == [] and stats["kept"] == 0 and stats["overlong_prompts"] == {"reasoner": 2, "actor": 2}
    demos, stats = scripted_demos(policy, env_fn, 2, seed=3, max_context=8, only_correct=False)
    assert demos == [] and stats["kept"] == 2 and stats["overlong_prompts"] == {"reasoner": 2, "actor": 2}
    cfg = SFTConfig(env_id="arith-calc-duo-v0", demos="scripted", num_demos=2, model="tiny-random", device="cpu",
                    max_context=8, only_correct=False)
    with pytest.raises(ValueError, match="no demonstration to train on .0 gathered, 4 over max_context=8"):
        run_sft(cfg, policy=policy, log=None)


def test_the_loss_is_on_the_assistant_tokens_only():
    policy = _policy("echo-duo-v0")
    tok = policy.tokenizer("speaker")
    prompt = policy.encode("speaker", [{"role": "user", "content": "Say a word."}])
    demo = Demo("speaker", prompt, response_ids(policy, "speaker", "apple"))
    b = policy.loaded_base("speaker")
    ids = torch.tensor([demo.prompt_ids + demo.response_ids])
    with torch.no_grad(), policy.use_adapter(b, policy.adapter_of("speaker")):
        logp = torch.log_softmax(b.model(input_ids=ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    per_token = logp.gather(-1, targets[:, None])[:, 0]
    n = len(demo.response_ids)
    with torch.no_grad():
        assert _nll(policy, "speaker", [demo]).item() == pytest.approx(-per_token[-n:].mean().item(), rel=1e-4)
    assert demo.response_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # EOS is trained: the model learns to stop


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


ECHO_ROWS = [
    {"agent": "speaker", "messages": [{"role": "system", "content": "Say one word."}, {"role": "user", "content": "Go."}], "response": "apple"},
    {"agent": "listener", "messages": [{"role": "user", "content": "The speaker said: apple"},
                                       {"role": "assistant", "content": "apple"}]},
]


def test_jsonl_demos_are_encoded_like_the_collector_and_bad_lines_are_clear(tmp_path):
    policy = _policy("echo-duo-v0")
    demos = demos_from_jsonl(policy, _jsonl(tmp_path / "d.jsonl", ECHO_ROWS), ["speaker", "listener"])
    assert demos[0].prompt_ids == policy.encode("speaker", ECHO_ROWS[0]["messages"])
    assert demos[1].prompt_ids == policy.encode("listener", ECHO_ROWS[1]["messages"][:1])
    assert demos[1].response_ids == response_ids(policy, "listener", "apple")
    for bad, msg in [({"agent": "critic", "messages": [], "response": "x"}, "not a role"),
                     ({"agent": "speaker", "messages": [{"role": "user", "content": "x"}]}, "assistant turn"),
                     ({"agent": "speaker"}, "write")]:
        with pytest.raises(ValueError, match=msg):
            demos_from_jsonl(policy, _jsonl(tmp_path / "bad.jsonl", [bad]), ["speaker", "listener"])


def test_sft_learns_the_demos_and_writes_a_run_dir_that_init_and_eval_load(tmp_path):
    out = tmp_path / "sft"
    cfg = SFTConfig(env_id="echo-duo-v0", demos=str(_jsonl(tmp_path / "d.jsonl", ECHO_ROWS * 4)), model="tiny-random",
                    device="cpu", out_dir=str(out), epochs=12, batch_size=4, lr=3e-2)
    result = run_sft(cfg, log=None)
    for role in ("speaker", "listener"):
        assert result.losses[role][-1] < 0.5 * result.first_loss[role]
    assert (out / "sft.json").is_file() and json.loads((out / "config.json").read_text())["algo"] == "grpo"
    saved = result.checkpoint
    # RL starts from those adapters (init_from), evaluation loads them as a checkpoint; same env: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rl = make_policy(GRPOConfig(env_id="echo-duo-v0", model="tiny-random", device="cpu", init_from=str(out)), ["speaker", "listener"])
    # other env settings than the SFT's (its prompts are not this run's): loaded, with a warning that names them
    for source in (out, saved):
        with pytest.warns(UserWarning, match=r"another environment.*vocabulary"):
            make_policy(GRPOConfig(env_id="echo-duo-v0", env_kwargs={"vocabulary": ["red", "blue"]}, model="tiny-random", device="cpu",
                                   init_from=str(source)), ["speaker", "listener"])
    fresh = make_policy(GRPOConfig(env_id="echo-duo-v0", model="tiny-random", device="cpu"), ["speaker", "listener"])
    from marft_algos.evaluation.policies import checkpoint_policy

    evaluated = checkpoint_policy(out).policy
    for role in ("speaker", "listener"):
        a, b, c = rl.adapter_state_dict(role), fresh.adapter_state_dict(role), evaluated.adapter_state_dict(role)
        assert all(torch.equal(a[k], c[k]) for k in a)
        assert any(not torch.equal(a[k], b[k]) for k in a)
    assert all(p.requires_grad for r in ("speaker", "listener") for p in rl.trainable_parameters(r))
    assert saved.endswith("step-00000000")
    with pytest.raises(ConfigError, match="LoRA r=8"):
        make_policy(GRPOConfig(env_id="echo-duo-v0", model="tiny-random", device="cpu", init_from=str(out), lora_r=4),
                    ["speaker", "listener"])
    with pytest.raises(ConfigError, match="no weights to start from"):
        make_policy(GRPOConfig(env_id="echo-duo-v0", model="tiny-random", device="cpu", init_from=str(tmp_path)),
                    ["speaker", "listener"])


def test_sft_is_deterministic_given_its_settings(tmp_path):
    """Two runs with the same settings (scripted demos: the seed picks the problems and the sample
    order) write the same adapters, what lets benchmarks/equal_budget.py copy one warm job's SFT run
    to another job of the same seed instead of training it again; another seed writes others."""
    runs = [SFTConfig(env_id="arith-duo-v0", demos="scripted", num_demos=3, model="tiny-random", device="cpu",
                      out_dir=str(tmp_path / name), epochs=2, batch_size=2, lr=1e-2, seed=seed)
            for name, seed in (("a", 0), ("b", 0), ("c", 1))]
    results = [run_sft(cfg, log=None) for cfg in runs]
    from marft_algos.evaluation.policies import checkpoint_policy

    a, b, c = (checkpoint_policy(r.out_dir).policy for r in results)
    for role in ("reasoner", "actor"):
        sa, sb, sc = a.adapter_state_dict(role), b.adapter_state_dict(role), c.adapter_state_dict(role)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert any(not torch.equal(sa[k], sc[k]) for k in sa)  # the seed matters: the test can fail
    assert results[0].losses == results[1].losses != results[2].losses


def test_cli_sft_then_train_init(tmp_path, capsys):
    from marft_algos.cli import main

    demos = _jsonl(tmp_path / "d.jsonl", ECHO_ROWS)
    sft = tmp_path / "sft"
    assert main(["sft", "--env", "echo-duo-v0", "--demos", str(demos), "--model", "tiny-random", "--out", str(sft),
                 "--epochs", "1", "--device", "cpu"]) == 0
    assert "--init" in capsys.readouterr().out
    rl = tmp_path / "rl"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--steps", "1", "--out", str(rl), "--init", str(sft),
            "--model", "tiny-random", "--set", "num_envs=2", "--set", "group_size=2", "--set", "progress=false",
            "--set", 'sampling_overrides={"speaker": {"max_new_tokens": 3}, "listener": {"max_new_tokens": 3}}']
    with pytest.warns(UserWarning, match=r"listener: max_new_tokens=3, demos p90 \d+"):  # 3 tokens cut the demos
        assert main(argv) == 0
    assert json.loads((rl / "config.json").read_text())["init_from"] == str(sft)
    assert main(["sft", "--env", "echo-duo-v0", "--demos", "scripted", "--model", "tiny-random", "--out", str(tmp_path / "x")]) == 2
    assert "no scripted" in capsys.readouterr().err
    assert main(["sft", "--env", "echo-duo-v0", "--demos", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "y")]) == 2
    assert main(["sft", "--env", "echo-duo-v0", "--epochs", "two", "--out", str(tmp_path / "z")]) == 2


def test_warmstart_benchmark_runs_on_the_tiny_model(tmp_path):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sft_warmstart.py"
    spec = importlib.util.spec_from_file_location("_bench_sft_warmstart", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench"
    with pytest.warns(UserWarning, match="SFT taught responses longer"):  # a smoke run: 4 new tokens cut the demos
        assert bench.main(["--model", "tiny-random", "--envs", "arith-calc-duo-v0", "--eval-n", "2", "--num-demos", "2",
                           "--epochs", "1", "--steps", "1", "--num-envs", "2", "--group-size", "2", "--max-new-tokens", "4",
                           "--eval-batch", "2", "--out", str(out)]) == 0
    data = json.loads((out / "sft_warmstart.json").read_text())
    assert [r["system"] for r in data["rows"]] == ["base", "sft", "sft + rl"]
    for row in data["rows"]:
        assert row["problems"] == 2 and 0.0 <= row["acc_lo"] <= row["accuracy"] <= row["acc_hi"] <= 1.0
        assert 0.0 <= row["tool_lo"] <= row["tool_rate"] <= row["tool_hi"] <= 1.0
    assert [d["difference"] for d in data["diffs"]] == ["sft - base", "sft + rl - sft"]
    assert (out / "arith-calc-duo-v0" / "sft" / "sft.json").is_file() and (out / "sft_warmstart.md").is_file()


NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def test_gsm8k_worked_solutions_become_calculator_segments():
    from marft_envs.tasks.gsm8k import calculator_segments, worked_solution

    assert worked_solution(NATALIA) == ("Natalia sold 48/2 = 24 clips in May.\n"
                                        "Natalia sold 48+24 = 72 clips altogether in April and May.")
    assert calculator_segments(NATALIA, 4) == [("Natalia sold 48/2 =", "48/2"),
                                               ("24 clips in May.\nNatalia sold 48+24 =", "48+24"),
                                               ("72 clips altogether in April and May.", None)]
    # the call budget cuts the plan: later computations stay in the text, as the worked solution writes them
    assert calculator_segments(NATALIA, 1)[1] == ("24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.", None)
    assert calculator_segments(NATALIA, 0) == [(worked_solution(NATALIA), None)]
    # an annotation the calculator does not reproduce (a typo in the data, a unit) is never called
    odd = "He pays 3 x 4 = <<3 x 4=12>>12 dollars and 5 = <<2+2=5>>5 more.\n#### 17"
    assert calculator_segments(odd, 4) == [("He pays 3 x 4 = 12 dollars and 5 = 5 more.", None)]


def test_gsm8k_scripted_demos_cover_the_train_split(data_dir):
    """On every GSM8K train row the pieces are the worked solution, cut at calls whose
    expressions the calculator reproduces; it reproduces every one of the split's annotations."""
    from marft_envs.data import load_split
    from marft_envs.tasks import gsm8k

    def squeeze(text):
        return "".join(text.split())

    rows = load_split("gsm8k", "train", data_dir)
    annotations = calls = 0
    for row in rows:
        annotated = [(x.strip(), r) for x, r in gsm8k._ANNOTATION.findall(row["answer"])]
        assert all(gsm8k._reproduces(x, r) for x, r in annotated), row["answer"]
        pieces = gsm8k.calculator_segments(row["answer"], 4)
        assert squeeze("".join(t for t, _ in pieces)) == squeeze(gsm8k.worked_solution(row["answer"]))
        exprs = [e for _, e in pieces if e is not None]
        assert exprs == [x for x, _ in annotated][: len(exprs)] and len(exprs) == min(4, len(annotated))
        annotations, calls = annotations + len(annotated), calls + len(exprs)
    assert len(rows) == 7473 and calls > 2.5 * len(rows) and annotations > 23_000


@pytest.mark.parametrize("env_id", ["gsm8k-calc-solo-v0", "gsm8k-calc-duo-v0", "gsm8k-duo-v0", "gsm8k-solo-v0", "gsm8k-planner-v0",
                                    "math-duo-v0", "math-solo-v0"])
def test_gsm8k_and_math_scripted_policies_solve_their_envs(env_id, data_dir):
    for seed in range(3):
        env = marft_envs.make(env_id, data_dir=str(data_dir))
        env.reset(seed=seed)
        _play_scripted(env)
        assert env.graded["grade"]["correct"], (env_id, seed)


def test_gsm8k_scripted_solo_solves_with_the_calculator_and_the_duo_checks(data_dir):
    env = marft_envs.make("gsm8k-calc-solo-v0", data_dir=str(data_dir))
    env.reset(options={"problem_index": 0})  # Natalia's clips: two annotated computations
    assert env.problem.meta["solution"] == NATALIA
    texts = _play_scripted(env)
    call = env.tool_loop.parser.example
    assert texts == [("actor", "Natalia sold 48/2 =\n" + call("calculator", {"expression": "48/2"})),
                     ("actor", "24 clips in May.\nNatalia sold 48+24 =\n" + call("calculator", {"expression": "48+24"})),
                     ("actor", "72 clips altogether in April and May.\nThe answer is \\boxed{72}.")]
    assert env.graded["grade"]["correct"]
    env = marft_envs.make("gsm8k-calc-duo-v0", data_dir=str(data_dir))
    env.reset(options={"problem_index": 0})
    texts = _play_scripted(env)  # the reasoner writes the solution; the actor checks its last computation, then answers
    assert texts == [("reasoner", "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May."),
                     ("actor", call("calculator", {"expression": "48+24"})), ("actor", "The answer is \\boxed{72}.")]
    policy = _policy("gsm8k-calc-solo-v0", env_kwargs={"data_dir": str(data_dir)})
    demos, stats = scripted_demos(policy, lambda: marft_envs.make("gsm8k-calc-solo-v0", data_dir=str(data_dir)), 2, seed=0)
    assert stats["kept"] == 2 and {d.role for d in demos} == {"actor"} and len(demos) >= 4  # every call and the answer


def test_sft_records_demo_lengths_and_rl_that_would_cut_them_is_warned(tmp_path, data_dir):
    from marft_algos.sft import demo_lengths

    assert demo_lengths([Demo("a", [1], [0] * n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)] + [Demo("b", [1], [0] * 4)]) == \
        {"a": {"p50": 5, "p90": 9, "max": 10}, "b": {"p50": 4, "p90": 4, "max": 4}}
    kw = {"data_dir": str(data_dir)}
    out = tmp_path / "sft"
    cfg = SFTConfig(env_id="gsm8k-calc-solo-v0", env_kwargs=kw, demos="scripted", num_demos=2, model="tiny-random",
                    device="cpu", out_dir=str(out), epochs=1)
    result = run_sft(cfg, log=None)
    lengths = json.loads((out / "sft.json").read_text())["result"]["response_tokens"]
    assert lengths == result.response_tokens and set(lengths) == {"actor"} and lengths["actor"]["p90"] > 24
    p90 = lengths["actor"]["p90"]
    for source in (out, result.checkpoint):  # the run dir or its checkpoint
        with pytest.warns(UserWarning, match=rf"actor: max_new_tokens=24, demos p90 {p90}"):
            make_policy(GRPOConfig(env_id="gsm8k-calc-solo-v0", env_kwargs=kw, model="tiny-random", device="cpu", init_from=str(source),
                                   sampling_overrides={"actor": {"max_new_tokens": 24}}), ["actor"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # room for the demos: no warning
        make_policy(GRPOConfig(env_id="gsm8k-calc-solo-v0", env_kwargs=kw, model="tiny-random", device="cpu", init_from=str(out),
                               sampling_overrides={"actor": {"max_new_tokens": p90}}), ["actor"])
