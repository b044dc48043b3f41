"""Code-with-tests envs and tasks: registry, topology, profiles, conformance, grading."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import marft_envs
from marft_envs.envs import CODE_ENV_IDS, register_builtin_envs
from marft_envs.tasks.code import HumanEvalTask, MBPPTask, build_program, extract_code
from marft_envs.testing import check_env

REPO = Path(__file__).resolve().parents[2]


def _play(env, actions: dict[str, str]) -> dict:
    """One turn with fixed actions per role; returns the graded agent's info."""
    graded = {}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        env.step(actions[agent])
        if "grade" in env.infos.get(agent, {}):
            graded = {"info": env.infos[agent], "rewards": dict(env.rewards)}
    return graded


def test_registry_and_lazy_data() -> None:
    for env_id in CODE_ENV_IDS:
        assert env_id in marft_envs.registry
    register_builtin_envs()  # idempotent
    code = ("import sys, marft_envs\n"
            "assert 'code-trio-v0' in marft_envs.registry\n"
            "assert 'marft_envs.tasks.code' not in sys.modules, 'registering imported the task'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("env_id,roles,graded", [
    ("code-solo-v0", ["coder"], "coder"),
    ("code-duo-v0", ["planner", "coder"], "coder"),
    ("code-trio-v0", ["planner", "coder", "reviewer"], "reviewer"),
])
def test_teams_topology_and_oracle(env_id: str, roles: list[str], graded: str) -> None:
    env = marft_envs.make(env_id)
    assert env.possible_agents == roles
    assert env.team.answer_agents == [graded]
    topo = env.team.topology
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            assert topo.dependency(a, b) and not topo.dependency(b, a)
    env.reset(options={"problem_index": 0})
    problem = env.problem
    assert problem.id == "humaneval/0" and "def has_close_elements" in problem.question
    assert "```python" in env.observe(graded)["prompt"]  # the task's instructions
    right = {a: "Plan: compare all pairs." for a in roles}
    right[graded] = "Here it is:\n" + problem.answer
    out = _play(env, right)
    assert out["rewards"][graded] == 1.0 and out["info"]["grade"]["correct"]
    details = out["info"]["grade"]["details"]
    assert details["n_tests"] == details["n_passed"] == len(details["tests"]) > 1
    env.reset(options={"problem_index": 0})
    wrong = dict(right)
    wrong[graded] = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    out = _play(env, wrong)
    assert out["rewards"][graded] == 0.0
    assert 0 < out["info"]["grade"]["details"]["n_passed"] < out["info"]["grade"]["details"]["n_tests"]


@pytest.mark.parametrize("env_id", CODE_ENV_IDS)
def test_check_env_conformance_and_fuzzing(env_id: str) -> None:
    t0 = time.monotonic()
    check_env(env_id, n_episodes=3)
    print(f"check_env({env_id}) {time.monotonic() - t0:.2f}s")


def test_no_code_is_graded_instantly_without_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    task = HumanEvalTask()
    problem = task.get(3)

    def no_spawn(*a, **k):
        raise AssertionError("a process was started for an answer without code")

    monkeypatch.setattr(subprocess, "Popen", no_spawn)
    for text in ["", "I am not sure.", "```python\n\n```", "\x00\x01 random ünïcode ∑ 🙂", "def"]:
        g = task.grade(text, problem)  # no process: no_spawn above would raise
        assert not g.correct and g.score == 0.0 and "no_code" in g.details["flags"]


def test_fraction_reward_mode() -> None:
    env = marft_envs.make("code-solo-v0", reward_mode="fraction")
    env.reset(options={"problem_index": 0})
    out = _play(env, {"coder": "```python\ndef has_close_elements(numbers, threshold):\n"
                                "    return False\n```"})
    d = out["info"]["grade"]["details"]
    assert 0 < d["n_passed"] < d["n_tests"]
    assert out["rewards"]["coder"] == pytest.approx(d["n_passed"] / d["n_tests"])
    assert not out["info"]["grade"]["correct"]


def test_extract_code_and_build_program() -> None:
    assert extract_code("a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code("```python\nx = 1\n```\n```text\nnot code\n```") == "x = 1\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("The answer is 42.") is None and extract_code(None) is None
    prompt = "import math\n\ndef helper(x):\n    return x\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n"
    prog = build_program(prompt, "def f(x):\n    return helper(x) + 1\n", "f")
    ns: dict = {}
    exec(prog, ns)
    assert ns["f"](1) == 2
    prog = build_program(prompt, "    return x * 2\n", "f")
    ns = {}
    exec(prog, ns)
    assert ns["f"](3) == 6


def _write_mbpp(root: Path) -> None:
    rows = [
        {"task_id": 2, "text": "Write a function to find the shared elements of two lists.",
         "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
         "test_list": ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == {4, 5}",
                       "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == {3, 4}"],
         "test_setup_code": "", "challenge_test_list": []},
        {"task_id": 3, "text": "Write a python function to identify non-prime numbers.",
         "code": "import math\ndef is_not_prime(n):\n    return any(n % i == 0 for i in "
                 "range(2, int(math.sqrt(n)) + 1))",
         "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                       "assert is_not_prime(35) == True"],
         "test_setup_code": "", "challenge_test_list": ["assert is_not_prime(37) == False"]},
    ]
    (root / "mbpp").mkdir()
    (root / "mbpp" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_mbpp_from_a_local_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_mbpp(tmp_path)
    task = MBPPTask("test", data_dir=tmp_path, challenge=True)
    assert len(task) == 2
    p = task.get(1)
    assert p.meta["entry_point"] == "is_not_prime" and "assert is_not_prime(2)" in p.question
    g = task.grade(p.answer, p)
    assert g.correct and g.details["n_tests"] == 4
    g = task.grade("```python\ndef is_not_prime(n):\n    return n > 2\n```", p)
    assert not g.correct and g.details["n_passed"] == 3  # only the challenge test fails
    monkeypatch.setenv("MARFT_DATA_DIR", str(tmp_path))
    env = marft_envs.make("code-duo-v0", dataset="mbpp", split="test")
    env.reset(options={"problem_index": 0})
    out = _play(env, {"planner": "Intersect the sets.", "coder": env.problem.answer})
    assert out["rewards"]["coder"] == 1.0


def test_mbpp_missing_file_names_both_fixes(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # fail fast, no download attempt
    with pytest.raises(FileNotFoundError) as e:
        MBPPTask("validation", data_dir=tmp_path)
    msg = str(e.value)
    assert "MARFT_DATA_DIR" in msg and "data_dir" in msg
    assert "google-research-datasets/mbpp" in msg and "mbpp/validation.jsonl" in msg
    with pytest.raises(ValueError, match="unknown code dataset"):
        marft_envs.make("code-solo-v0", dataset="apps")


def test_grader_flags_reach_info_and_stats() -> None:
    """no_code / load_error / program_timeout are in info["flags"] and env.stats; a
    program the sandbox kills is a wrong answer, not a verifier timeout."""
    env = marft_envs.make("code-solo-v0", timeout=1.5)
    cases = [
        ("I do not know.", "no_code", "no_code"),
        ("```python\nraise SystemExit(0)\n```", "load_error", "load_errors"),
        ("```python\ndef has_close_elements(numbers, threshold):\n    while True:\n"
         "        pass\n```", "program_timeout", "program_timeouts"),
    ]
    for n, (text, flag, stat) in enumerate(cases, start=1):
        env.reset(options={"problem_index": 0})
        info = _play(env, {"coder": text})["info"]
        assert flag in info["flags"] and flag in info["grade"]["details"]["flags"], info["flags"]
        assert env.stats[stat] == 1 and not info["grade"]["correct"]
        assert not info["grade"]["timed_out"] and "grade_timeout" not in info["flags"]
        assert env.stats["turns"] == n
    assert env.stats["grade_timeouts"] == 0 and env.stats["grade_errors"] == 0
    assert info["grade"]["details"]["program_timed_out"] is True
