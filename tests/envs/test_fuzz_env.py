"""Fuzzing: any action never raises or hangs; spaces sample what they contain."""

from __future__ import annotations

import time

import pytest
from helpers.fuzz import fuzz_steps
from helpers.timing import MARGIN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs import UnicodeText
from marft_envs.spaces import observation_space

ENV_IDS = ["arith-duo-v0", "arith-routed-v0", "arith-trio-v0", "echo-duo-v0",
           "arith-malt-v0", "arith-rema-v0", "arith-planner-v0"]  # the workflow env: tests/envs/test_workflow.py
_ENVS = {env_id: marft_envs.make(env_id, horizon=2, feedback=True, max_action_chars=2048) for env_id in ENV_IDS}

latex = st.sampled_from(
    ["\\boxed{", "}", "{", "\\frac{", "\\sqrt{", "^{", "_", "$", "\\\\", "\\left(", "\\right)", "ROUTE:", "9", "-", " "]
)
actions = st.one_of(
    st.none(),
    st.text(max_size=300),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=300),
    st.binary(max_size=300),
    st.lists(latex, max_size=400).map("".join),
    st.integers(min_value=1, max_value=5).map(lambda k: "\\boxed{" * (k * 20_000)),
    st.sampled_from(["x" * 1_000_000, "{" * 300_000, "\x00" * 100_000, "\ud800" * 1000]),
    st.integers(),
    st.floats(allow_nan=True),
    st.lists(st.integers(), max_size=5),
)

_FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


# Envs whose grader starts processes (sandbox, math worker): fewer examples keep the suite fast.
_FUZZ_GRADED = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
_GRADED_KW = {"horizon": 2, "feedback": True, "max_action_chars": 2048}
_CODE_ENV = marft_envs.make("code-solo-v0", timeout=1.5, **_GRADED_KW)  # HumanEval ships in a package
code_like = st.sampled_from(
    [
        "```python\ndef f(x):\n    return x\n```",
        "```python\nwhile True:\n    pass\n```",
        "```python\nimport os\nos._exit(0)\n```",
        "```python\n" + "(" * 500 + "\n```",
        "```\n\x00\x01\n```",
        "def has_close_elements(numbers, threshold):\n    return True\n",
    ]
)


def _play(env, seed: int, episode: list) -> None:
    """One episode of ``episode``'s actions: observations stay in their spaces, rewards
    finite, every step returns promptly and flags bad actions."""
    env.reset(seed=seed)
    for agent, action in fuzz_steps(env, episode, 50):
        if action is not None and agent in env.infos:
            assert isinstance(env.infos[agent]["flags"], list)
            last_text = env.executed[-1][1] if env.executed else env.history[-1][-1][1]
            assert len(last_text) <= env.max_action_chars
    assert not env.agents


@pytest.mark.parametrize("env_id", ENV_IDS)
@_FUZZ
@given(seed=st.integers(0, 2**16), episode=st.lists(actions, min_size=1, max_size=10))
def test_any_action_sequence_is_handled(env_id, seed, episode):
    _play(_ENVS[env_id], seed, episode)


@_FUZZ_GRADED
@given(seed=st.integers(0, 163), episode=st.lists(st.one_of(actions, code_like), min_size=1, max_size=4))
def test_any_action_sequence_is_handled_code(seed, episode):
    _play(_CODE_ENV, seed, episode)
    assert _CODE_ENV.stats["grade_errors"] == 0, "a sandbox infrastructure failure"


@pytest.fixture(scope="module")
def data_envs(data_dir) -> dict:
    """math-solo-v0 and gsm8k-solo-v0 on the real data (conftest: fail in CI if absent)."""
    return {
        env_id: marft_envs.make(env_id, split="test", data_dir=str(data_dir), **_GRADED_KW)
        for env_id in ("math-solo-v0", "gsm8k-solo-v0")
    }


@pytest.mark.parametrize("env_id", ["math-solo-v0", "gsm8k-solo-v0"])
@_FUZZ_GRADED
@given(seed=st.integers(0, 2**16), episode=st.lists(actions, min_size=1, max_size=4))
def test_any_action_sequence_is_handled_math(data_envs, env_id, seed, episode):
    _play(data_envs[env_id], seed, episode)


@_FUZZ
@given(action=actions)
def test_wrong_answers_get_zero_outcome(action):
    env = _ENVS["arith-duo-v0"]
    env.reset(seed=0)
    env.step("reasoning")
    answer = env.problem.answer
    if answer.lstrip("-") in repr(action):
        return  # may be right by accident (bytes and numbers are read as text)
    env.step(action)
    assert env.infos["actor"]["reward_components"]["outcome"] == 0.0


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_episodes_of_space_samples(env_id):
    """The spaces' own sampling drives 30 episodes per env."""
    env = marft_envs.make(env_id, horizon=2)
    for agent in env.possible_agents:
        env.action_space(agent).seed(123)
    for seed in range(30):
        env.reset(seed=seed)
        for agent in env.agent_iter(50):
            obs, _, term, trunc, _ = env.last()
            assert env.observation_space(agent).contains(obs)
            env.step(None if term or trunc else env.action_space(agent).sample())
        assert not env.agents


# ------------------------------------------------------------------------------ spaces
@given(text=st.text(max_size=50))
def test_unicode_text_contains_any_str(text):
    assert UnicodeText(50).contains(text)
    assert not UnicodeText(max(0, len(text) - 1)).contains(text) or len(text) == 0


def test_unicode_text_membership_edges():
    space = UnicodeText(11)
    for member in ["", " ", "hi there", "\n\t", "\u00e9\u4e2d\U0001f600", "\\frac{1}{2}", "x" * 11]:
        assert space.contains(member), member
    for non_member in ["x" * 12, b"bytes", None, 5, ["a"]]:
        assert not space.contains(non_member)
    assert space == UnicodeText(11) and space != UnicodeText(10) and repr(space) == "UnicodeText(11)"


def test_unicode_text_sampling_is_varied_seeded_and_in_space():
    space = UnicodeText(300, seed=7)
    samples = [space.sample() for _ in range(400)]
    assert all(space.contains(s) for s in samples)
    joined = "".join(samples)
    assert "" in samples and any(len(s) == 300 for s in samples)
    assert " " in joined and "\n" in joined and any(c.isdigit() for c in joined)
    assert "\\" in joined and "{" in joined and any(ord(c) > 0x7F for c in joined)
    again = UnicodeText(300, seed=7)
    assert [again.sample() for _ in range(400)] == samples
    # masked sampling falls back to gymnasium's Text over the base charset
    masked = space.sample(mask=(5, None))
    assert len(masked) == 5 and space.contains(masked)


def test_observation_space_has_no_observation_key():
    space = observation_space(100, 3)
    assert set(space.spaces) == {"prompt", "turn"}
    space.seed(0)
    sample = space.sample()
    assert space.contains(sample) and 0 <= sample["turn"] <= 3


# ------------------------------------------------------- real graders (separate processes)
_ADVERSARIAL = [
    "\\boxed{10^{10^{10^{10}}}}",  # may exhaust the grader's time budget: must come back as a timeout
    "\\boxed{" + "\\frac{" * 400 + "1" + "}" * 400 + "}",
    "\\boxed{\\sqrt{" * 300,
    "\\boxed{x}" * 3000,
]


@pytest.mark.parametrize("env_id", ["math-solo-v0", "gsm8k-solo-v0"])
def test_adversarial_latex_on_real_graders(env_id, monkeypatch, data_dir):
    monkeypatch.setenv("MARFT_DATA_DIR", str(data_dir))
    env = marft_envs.make(env_id)
    for text in _ADVERSARIAL:
        env.reset(seed=0)
        start = time.monotonic()
        env.step(text)
        assert time.monotonic() - start < 20.0 + MARGIN  # the graders' hard kill is at 5 s
        info = env.infos["actor"]
        assert env.rewards["actor"] == 0.0 and not info["grade"]["correct"]
        if info["grade"]["timed_out"]:
            assert "grade_timeout" in info["flags"]
    assert env.stats["turns"] == len(_ADVERSARIAL)
