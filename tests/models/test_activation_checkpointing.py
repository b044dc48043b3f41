"""Activation checkpointing: the same log-probs and gradients, far fewer saved activations."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from marft_algos.models import TeamPolicy, build_tiny_model  # noqa: E402

ROLES = ["speaker", "listener"]
# a shared prefix (rows 0-2) exercises the prefix-sharing path of the plain policy
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 40], [20, 21, 22]]
RESPONSES = [[30, 31, 32], [33, 34], [35, 36, 37, 38], [39]]


def policy(**kw) -> TeamPolicy:
    return TeamPolicy(ROLES, base=build_tiny_model(seed=3, layers=4), seed=1, **kw)


def logprobs_and_grads(pol: TeamPolicy, role: str = "listener"):
    for p in pol.trainable_parameters(role):
        p.grad = None
    stats = pol.sequence_logprobs(role, PROMPTS, RESPONSES, temperature=0.7)
    loss = -(stats.logprobs.sum() + 0.1 * stats.entropy.sum())
    loss.backward()
    return stats.logprobs.detach(), [p.grad.detach().clone() for p in pol.trainable_parameters(role)]


def saved_bytes(pol: TeamPolicy, role: str = "listener") -> int:
    """Bytes autograd keeps for the backward of one training forward."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pol.sequence_logprobs(role, PROMPTS, RESPONSES)
    return total


def test_same_logprobs_and_gradients():
    plain, ckpt = policy(), policy(activation_checkpointing=True)
    lp0, g0 = logprobs_and_grads(plain)
    lp1, g1 = logprobs_and_grads(ckpt)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    assert len(g0) == len(g1) and any(g.abs().sum() > 0 for g in g0)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_layers_are_recomputed_and_activations_not_kept():
    plain, ckpt = policy(share_prefixes=False), policy(activation_checkpointing=True)
    layers = ckpt._bases[0].ckpt_layers
    assert len(layers) == 4 and not any(layer.training for layer in layers)
    calls = []
    for layer in layers:
        layer.self_attn.register_forward_hook(lambda *a: calls.append(1))
    _, grads = logprobs_and_grads(ckpt)
    assert len(calls) == 2 * len(layers)  # forward + recomputation in the backward (hooks on a sublayer)
    assert not any(layer.training for layer in layers)  # only armed inside the training forward
    full, kept = saved_bytes(plain), saved_bytes(ckpt)
    assert kept < full / 3, (kept, full)


def test_no_grad_and_reference_passes_do_not_checkpoint():
    ckpt = policy(activation_checkpointing=True)
    calls = []
    for layer in ckpt._bases[0].ckpt_layers:
        layer.self_attn.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        ckpt.sequence_logprobs("speaker", PROMPTS, RESPONSES)
    ckpt.sequence_logprobs("speaker", PROMPTS, RESPONSES, reference=True)
    assert len(calls) == 2 * 4  # one plain forward each, never a recomputation


def test_config_reaches_the_policy_and_a_step_trains():
    from helpers.tiny_echo import ENV_KWARGS, SAMPLING

    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=4, group_size=2,
                     progress=False, tensorboard=False, sampling_overrides=SAMPLING, activation_checkpointing=True)
    t = GRPOTrainer(cfg)
    assert t.policy.activation_checkpointing and t.policy._bases[0].ckpt_layers
    m = t.train_step()
    assert m["train/step"] == 1.0 and m.get("train/nonfinite_skips", 0.0) == 0.0


def test_the_head_keeps_no_vocab_sized_tensor_with_or_without_checkpointing():
    """The LM head runs in recomputed chunks, checkpointed or not, prefixes shared or not:
    nothing [tokens, vocab] is saved for the backward (issue 28 item 24). With the chunked
    head off (FSDP2's setting) the full head's logits are."""
    full_head, plain, shared = policy(share_prefixes=False), policy(share_prefixes=False), policy()
    full_head.chunked_head = False
    ckpt = policy(activation_checkpointing=True)
    vocab = ckpt.model("listener").get_output_embeddings().out_features

    def saved_shapes(pol: TeamPolicy) -> list[tuple[int, ...]]:
        shapes = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            pol.sequence_logprobs("listener", PROMPTS, RESPONSES)
        return shapes

    assert any(s and s[-1] == vocab for s in saved_shapes(full_head))
    for pol in (plain, shared, ckpt):
        assert not any(s and s[-1] == vocab for s in saved_shapes(pol))
        assert isinstance(pol.model("listener").get_output_embeddings(), torch.nn.Linear)  # the head is back in place


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_head_matches_the_full_head(entropy_grad):
    """Several chunks (of 3 tokens) give the full head's log-probs, entropies and gradients."""
    from marft_algos.models.chunked_head import chunked_head_stats

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    logp_all = torch.log_softmax(head(hidden) / 0.7, dim=-1)
    logp, ent = logp_all.gather(-1, targets[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)
    (logp.sum() + (0.3 * ent.sum() if entropy_grad else 0)).backward()
    want = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    logp2, ent2 = chunked_head_stats(head, hidden, targets, temperature=0.7, entropy_grad=entropy_grad, chunk_elements=3 * 11)
    assert ent2.requires_grad == entropy_grad
    (logp2.sum() + (0.3 * ent2.sum() if entropy_grad else 0)).backward()
    torch.testing.assert_close(logp2, logp)
    torch.testing.assert_close(ent2, ent.detach())
    torch.testing.assert_close(hidden.grad, want[0])
    torch.testing.assert_close(head.weight.grad, want[1])


def test_models_with_logit_softcapping_keep_the_full_head():
    from types import SimpleNamespace

    from marft_algos.models.chunked_head import supports_chunked_head

    class Model(SimpleNamespace):
        def get_output_embeddings(self):
            return self.head

    head = torch.nn.Linear(4, 6)
    assert supports_chunked_head(Model(head=head, config=SimpleNamespace()))
    assert not supports_chunked_head(Model(head=head, config=SimpleNamespace(final_logit_softcapping=30.0)))
    assert not supports_chunked_head(Model(head=head, config=SimpleNamespace(logit_scale=0.0625)))
    assert not supports_chunked_head(Model(head=torch.nn.Identity(), config=SimpleNamespace()))
