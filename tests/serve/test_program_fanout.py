"""A program's fan-out costs one engine round: the collector answers every pending call
of every program env in one ``generate`` batch, each call its own transition."""

from __future__ import annotations

import pytest

from marft_algos.rollout import RolloutCollector
from marft_envs.program_env import ProgramEnv
from marft_envs.testing import check_env
from tests.envs.test_program_env import PROBLEMS, ROLES, duo, fan_out
from tests.helpers.scripted import CharPolicy

pytest.importorskip("marft_algos.models")


class Counting(CharPolicy):
    """Replies ``1``; ``batches`` keeps the (role, prompt) of every engine call's requests."""

    eos = True

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []

    def say(self, role: str, prompt: str) -> str:
        """Branch (a) says ALPHA, branch (b) BETA, the checker 1."""
        return "ALPHA" if prompt.endswith("(a)") else "BETA" if prompt.endswith("(b)") else "1"

    def generate(self, requests):
        """Record the batch, then reply."""
        self.batches.append([(r.role, "".join(chr(i) for i in r.prompt_ids)) for r in requests])
        return super().generate(requests)


def test_a_two_way_fan_out_takes_one_engine_call_for_both_branches() -> None:
    policy = Counting()
    col = RolloutCollector(lambda: ProgramEnv(fan_out, ROLES, PROBLEMS), policy, num_envs=2, seed=0, step_workers=2,
                           share_prefill=False)
    batch = col.collect()
    # round 1: both branches of both episodes; round 2: the two checkers
    assert [len(b) for b in policy.batches] == [4, 2]
    assert sorted(role for role, _ in policy.batches[0]) == ["solver"] * 4
    for ep in batch.episodes:
        trs = ep.transitions
        assert [t.agent for t in trs] == ["solver", "solver", "checker"]
        assert sorted(t.info["call"] for t in trs[:2]) == [0, 1] and trs[2].info["call"] == 2
        assert [t.info["trace"]["call"] for t in trs] == [t.info["call"] for t in trs]  # the trace of that call
        for t in trs:  # each call's exact prompt and sampled ids, with its own reply
            prompt = "".join(chr(i) for i in t.prompt_ids)
            assert t.text == policy.say(t.agent, prompt)
            assert t.response_ids == [ord(c) for c in t.text] + [0] and t.sampler_logprobs == [-0.5] * len(t.response_ids)
        assert trs[2].extras["prompt"][0]["content"] == "A: ALPHA\nB: BETA"  # each branch got its own reply
        assert ep.team_return == 1.0 and trs[-1].info["call_order"] == ["solver", "solver", "checker"]
    assert batch.metrics["rollout/fanout_calls"] == 2.0


def test_a_sequential_program_is_unchanged_one_call_per_round() -> None:
    policy = Counting()
    col = RolloutCollector(lambda: ProgramEnv(duo, ROLES, PROBLEMS), policy, num_envs=2, seed=0, share_prefill=False)
    batch = col.collect()
    assert [len(b) for b in policy.batches] == [2, 2]
    assert all([t.agent for t in ep.transitions] == ["solver", "checker"] for ep in batch.episodes)


def test_pending_calls_and_select_call_keep_aec_semantics() -> None:
    env = ProgramEnv(fan_out, ROLES, PROBLEMS)
    env.reset(options={"problem_index": 0})
    calls = env.pending_calls()
    assert [role for _, role in calls] == ["solver", "solver"]
    second = calls[1][0]
    assert env.select_call(second) == "solver" and env.pending_calls()[0][0] == second
    content = env.messages("solver")[0]["content"]
    env.step("BETA" if content.endswith("(b)") else "ALPHA")
    assert [i for i, _ in env.pending_calls()] == [calls[0][0]]  # the other branch is selected now
    with pytest.raises(KeyError, match="not pending"):
        env.select_call(second)
    check_env(ProgramEnv(fan_out, ROLES, PROBLEMS), n_episodes=2)


def test_transcripts_hold_each_calls_role_episode_step_tokens_and_latency(tmp_path) -> None:
    """What the Transcripts callback writes (MetricsLogger.log_transcripts) for a program env."""
    import json

    from marft_algos.logging import MetricsLogger

    batch = RolloutCollector(lambda: ProgramEnv(fan_out, ROLES, PROBLEMS), Counting(), num_envs=1, seed=0).collect()
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log_transcripts(7, batch.episodes)
    line = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[0])
    calls = [a["call"] for a in line["episode"]["actions"]]
    assert [c["role"] for c in calls] == ["solver", "solver", "checker"]
    assert sorted(c["index"] for c in calls) == [0, 1, 2] and [c["episode_step"] for c in calls] == [0, 1, 2]
    ep = batch.episodes[0]
    assert all(c["step"] == 7 and c["episode"] == ep.episode_id for c in calls)
    assert len({c["program_episode"] for c in calls}) == 1 and len(calls[0]["program_episode"]) == 32
    for c, t in zip(calls, ep.transitions, strict=True):
        assert c["prompt_tokens"] == len(t.prompt_ids) > 0 and c["completion_tokens"] == len(t.response_ids) > 0
        assert isinstance(c["latency_s"], float) and 0 <= c["latency_s"] < 60
    # a built-in env's actions have no call trace
    import marft_envs

    other = RolloutCollector(lambda: marft_envs.make("echo-duo-v0"), Counting(), num_envs=1, seed=0).collect()
    logger.log_transcripts(8, other.episodes)
    line = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[1])
    assert all("call" not in a for a in line["episode"]["actions"])


def test_opentelemetry_spans_carry_genai_attributes_and_the_trajectory_step() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from marft_algos.serve.otel import OTelCallback

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    batch = RolloutCollector(lambda: ProgramEnv(fan_out, ROLES, PROBLEMS), Counting(), num_envs=1, seed=0).collect()
    cb = OTelCallback(tracer=provider.get_tracer("test"))

    class _Trainer:
        global_step = 3

    cb.on_step_end(_Trainer(), {}, batch)
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name.startswith("chat ")]
    (root,) = [s for s in spans if s.name.startswith("episode ")]
    assert cb.spans == 3 and [s.attributes["agent.trajectory.step"] for s in calls] == [0, 1, 2]
    ep = batch.episodes[0]
    for s, t in zip(calls, ep.transitions, strict=True):
        a = s.attributes
        assert s.parent.span_id == root.context.span_id
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == t.agent == a["gen_ai.agent.name"]
        assert a["gen_ai.usage.input_tokens"] == len(t.prompt_ids) and a["gen_ai.usage.output_tokens"] == len(t.response_ids)
        assert a["gen_ai.conversation.id"] == t.info["trace"]["program_episode"] and a["marft.train_step"] == 3
        assert s.end_time - s.start_time == int(t.info["trace"]["latency_s"] * 1e9)
