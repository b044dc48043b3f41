"""Checkpoints: exact resume (N steps == N/2 + resume N/2) and atomic saves."""

from __future__ import annotations

import json

import pytest
import torch

import marft_algos.checkpoint as ckpt_mod
from marft_algos.algos.grpo import GRPOConfig
from marft_algos.algos.ippo import IPPOConfig
from marft_algos.checkpoint import CheckpointError, find_checkpoint, list_checkpoints

pytest.importorskip("marft_algos.models")
from helpers.tiny_echo import ENV_KWARGS, SAMPLING, letter_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402

KEYS = ("team/reward", "agent/speaker/policy_loss", "agent/listener/policy_loss", "agent/speaker/kl", "agent/listener/entropy", "agent/listener/grad_norm")


def grpo_cfg(out, **kw):
    base = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=8, group_size=4, steps=4, lr=0.02,
                progress=False, tensorboard=False, plot=False, out_dir=str(out), sampling_overrides=SAMPLING, ppo_epochs=2,
                num_minibatches=2, warmup_steps=2, seed=3)
    base.update(kw)
    return GRPOConfig(**base)


def ippo_cfg(out, **kw):
    base = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=8, steps=4, lr=0.02, progress=False,
                tensorboard=False, plot=False, out_dir=str(out), sampling_overrides=SAMPLING, num_minibatches=2, seed=3)
    base.update(kw)
    return IPPOConfig(**base)


def marft_cfg(out, **kw):
    # recovery on (the default) with a short warm-up: its detector state must resume too
    base = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=8, steps=4, lr=0.02, critic_lr=0.01,
                progress=False, tensorboard=False, plot=False, out_dir=str(out), sampling_overrides=SAMPLING, ppo_epochs=2,
                num_minibatches=2, seed=3, recovery={"warmup": 3}, kl_threshold=0.5)
    base.update(kw)
    return MARFTActionConfig(**base)


TRAINERS = {"grpo": (GRPOTrainer, grpo_cfg), "ippo": (IPPOTrainer, ippo_cfg), "marft-action": (MARFTActionTrainer, marft_cfg)}
MARFT_KEYS = ("agent/speaker/value_loss", "agent/listener/action_kl", "critic/grad_norm")


def _series(hist, keys=KEYS):
    return {k: [h.get(k) for h in hist] for k in keys}


@pytest.mark.parametrize("algo", ["grpo", "ippo", "marft-action"])
def test_resume_gives_identical_metrics(tmp_path, algo):
    cls, mk = TRAINERS[algo]
    keys = KEYS + (MARFT_KEYS if algo == "marft-action" else ())
    full = cls(mk(tmp_path / "full"), policy=letter_policy())
    init = [p.detach().clone() for a in full.agents for p in full.policy.trainable_parameters(a)]
    full.train()
    half = cls(mk(tmp_path / "split"), policy=letter_policy())
    half.train(steps=2)
    del half
    resumed = cls(mk(tmp_path / "split"), policy=letter_policy())  # what a fresh process builds
    resumed.load_checkpoint(tmp_path / "split")
    assert resumed.global_step == 2
    resumed.train()
    a, b = _series(full.history, keys), _series(resumed.history, keys)
    for k in keys:
        assert len(a[k]) == len(b[k]) == 4
        for x, y in zip(a[k], b[k], strict=True):
            assert (x is None and y is None) or x == pytest.approx(y, abs=1e-6), (k, a[k], b[k])
    # training moved the weights (otherwise equality would be vacuous) and both runs agree
    now = [p.detach() for a in full.agents for p in full.policy.trainable_parameters(a)]
    assert any(not torch.equal(a, b) for a, b in zip(init, now, strict=True))
    for agent in full.agents:
        for p, q in zip(full.policy.trainable_parameters(agent), resumed.policy.trainable_parameters(agent), strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    if algo == "marft-action":
        # the collapse detector resumed armed, with the same baselines (no second warm-up)
        assert full.algorithm.recovery.detector.healthy_steps == 4
        assert resumed.algorithm.recovery.detector.state_dict() == full.algorithm.recovery.detector.state_dict()
        assert resumed.algorithm.critic.state_dict()["heads"].keys() == full.algorithm.critic.state_dict()["heads"].keys()
        for k, v in full.algorithm.critic.state_dict()["heads"].items():
            torch.testing.assert_close(v, resumed.algorithm.critic.state_dict()["heads"][k], atol=1e-6, rtol=0)
    # the resumed run's metrics file has every step once
    steps = [json.loads(x)["step"] for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, caplog):
    t = GRPOTrainer(grpo_cfg(tmp_path, steps=1), policy=letter_policy())
    t.train()  # final save at step 1
    root = tmp_path / "checkpoints"
    good = find_checkpoint(tmp_path)
    assert good.name == "step-00000001"
    t.train_step()

    real_save = torch.save

    def crash(obj, path, *a, **kw):
        real_save(obj, path, *a, **kw)
        raise KeyboardInterrupt("power cut after trainer.pt")  # mid-save: manifest never written

    monkeypatch.setattr(ckpt_mod.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        t.save_checkpoint()
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    assert (root / "latest").read_text().strip() == "step-00000001"
    assert find_checkpoint(tmp_path) == good
    assert [p.name for p in list_checkpoints(root)] == ["step-00000001"]
    assert not list(root.glob(".tmp-*"))  # the partial dir was removed

    # a crash after the rename but before `latest` moved: latest still names a valid checkpoint
    monkeypatch.setattr(ckpt_mod, "write_text_atomic", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        t.save_checkpoint()
    monkeypatch.undo()
    assert find_checkpoint(tmp_path) == good

    # a checkpoint whose files were damaged is refused, and the loader falls back
    (root / "latest").write_text("step-00000002\n")
    with open(root / "step-00000002" / "trainer.pt", "r+b") as fh:
        fh.seek(10)
        fh.write(b"\x00\x01\x02\x03")
    with caplog.at_level("WARNING", logger="marft"):
        assert find_checkpoint(tmp_path) == good
    assert "using the older checkpoint" in caplog.text and "step-00000002: file trainer.pt fails its checksum" in caplog.text
    with pytest.raises(CheckpointError):
        ckpt_mod.verify_checkpoint(root / "step-00000002")

    fresh = GRPOTrainer(grpo_cfg(tmp_path, steps=1), policy=letter_policy())
    fresh.load_checkpoint(tmp_path)
    assert fresh.global_step == 1


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        find_checkpoint(tmp_path)


def test_load_in_parts_restores_only_what_is_asked(tmp_path):
    from marft_algos.checkpoint import CHECKPOINT_PARTS
    from marft_algos.seeding import rng_state

    src = IPPOTrainer(ippo_cfg(tmp_path / "src", steps=2), policy=letter_policy())
    src.train()
    saved = src.state_dict()
    heads = {a: [p.detach().clone() for p in src.algorithm.value_parameters(a)] for a in src.agents}
    weights = [p.detach().clone() for a in src.agents for p in src.policy.trainable_parameters(a)]

    dst = IPPOTrainer(ippo_cfg(tmp_path / "dst", steps=2, seed=4), policy=letter_policy(seed=1))
    collector_before = dst.collector.state_dict()
    torch_before = rng_state()["torch"]
    dst.load_checkpoint(tmp_path / "src", parts=("weights",))
    # the weights (policy and value heads) came over ...
    now = [p.detach() for a in dst.agents for p in dst.policy.trainable_parameters(a)]
    assert all(torch.equal(a, b) for a, b in zip(weights, now, strict=True))
    assert all(torch.equal(x, y) for a in dst.agents for x, y in zip(heads[a], dst.algorithm.value_parameters(a), strict=True))
    # ... and nothing else: fresh optimizers, own step count, problem stream and RNG streams
    assert dst.global_step == 0 and not dst.optimizers["speaker"].state
    assert dst.collector.state_dict() == collector_before
    assert torch.equal(rng_state()["torch"], torch_before)
    dst.load_checkpoint(tmp_path / "src", parts=("data", "progress"))
    assert dst.global_step == 2 and dst.collector.state_dict() == saved["collector"] and not dst.optimizers["speaker"].state
    dst.load_checkpoint(tmp_path / "src", parts=("optimizers", "schedulers"))
    assert dst.optimizers["speaker"].state and dst.schedulers["speaker"].state_dict() == saved["schedulers"]["speaker"]
    with pytest.raises(ValueError, match="unknown checkpoint parts"):
        dst.load_checkpoint(tmp_path / "src", parts=("weights", "optimiser"))
    assert set(CHECKPOINT_PARTS) == {"weights", "optimizers", "schedulers", "rng", "data", "progress"}


def test_no_usable_checkpoint_says_why(tmp_path):
    t = GRPOTrainer(grpo_cfg(tmp_path, steps=1), policy=letter_policy())
    t.train()
    (tmp_path / "checkpoints" / "step-00000001" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no usable checkpoint under .*step-00000001: file config.json has the wrong size"):
        find_checkpoint(tmp_path)


def test_stale_leftovers_are_cleaned_but_live_saves_are_not(tmp_path):
    import os

    t = GRPOTrainer(grpo_cfg(tmp_path, steps=1), policy=letter_policy())
    t.train()
    root = tmp_path / "checkpoints"
    dead = 4194304 + 7  # above Linux's largest pid: never a live process
    # a kill between the two renames of a same-step re-save: the old dir is all that is left
    os.rename(root / "step-00000001", root / f".old-step-00000001-{dead}-1")
    live = root / f".tmp-step-00000002-{os.getppid()}-1"  # another live process's save in progress
    stale = root / f".tmp-step-00000002-{dead}-1"
    live.mkdir()
    stale.mkdir()
    ckpt_mod.clean_stale(root)
    assert find_checkpoint(tmp_path).name == "step-00000001"  # put back
    assert not list(root.glob(".old-*")) and not stale.exists() and live.exists()
    t.train_step()
    t.save_checkpoint()  # its prune keeps the live process's temp dir too
    assert live.exists() and not stale.exists()
