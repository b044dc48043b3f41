"""TeamPolicy on the tiny model: batched multi-adapter decoding, sampling controls,
log-prob recomputation, EOS trainability, context limits, persistence and memory."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.policies import perturb, perturbed_policy
from torch import nn

from marft_algos.models import (
    GenRequest,
    LoraSettings,
    SamplingParams,
    TeamPolicy,
    build_tiny_model,
)

ROLES = ["planner", "solver", "critic_agent"]
GREEDY = SamplingParams(greedy=True, max_new_tokens=12)


@pytest.fixture(scope="module")
def policy() -> TeamPolicy:
    return perturbed_policy(ROLES)


def _prompt(policy: TeamPolicy, role: str, text: str) -> list[int]:
    return policy.encode(role, [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}])


# --------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------


def test_encode_uses_the_tokenizers_chat_template(policy):
    msgs = [{"role": "user", "content": "2+2?"}]
    ids = policy.encode("planner", msgs)
    tok = policy.tokenizer("planner")
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")  # generation prompt added
    # a different template changes the ids: nothing is hard-coded
    model, tok2 = build_tiny_model()
    tok2.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>>"
    other = TeamPolicy(["a"], base=(model, tok2))
    assert other.tokenizer("a").decode(other.encode("a", msgs)) == "[user] 2+2?\n>>"


# --------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------


def test_adapters_differ_and_batched_equals_per_adapter_greedy(policy):
    prompts = [_prompt(policy, r, t) for r, t in zip(ROLES, ["a cat", "two dogs and more", "x"], strict=True)]
    reqs = [GenRequest(r, p, GREEDY) for r, p in zip(ROLES, prompts, strict=True)]
    reqs.append(GenRequest("solver", prompts[0], GREEDY))  # same prompt, other adapter
    batched = policy.generate(reqs)
    single = [policy.generate([r])[0] for r in reqs]
    for b, s in zip(batched, single, strict=True):
        assert b.token_ids == s.token_ids
        assert b.text == s.text
        assert max(abs(x - y) for x, y in zip(b.logprobs, s.logprobs, strict=True)) < 1e-4
    # roles really use different adapters: same prompt, different continuation
    assert batched[0].token_ids != batched[3].token_ids
    # and the per-row peft path equals peft's own single-adapter generate (set_adapter)
    peft_model = policy.model("solver")
    peft_model.set_adapter("solver")
    try:
        hf = peft_model.generate(
            input_ids=torch.tensor([prompts[1]]), attention_mask=torch.ones(1, len(prompts[1]), dtype=torch.long),
            max_new_tokens=12, do_sample=False, pad_token_id=policy.tokenizer("solver").pad_token_id,
        )
    finally:
        policy.set_train_role(None)  # set_adapter rewrote requires_grad flags
    n = len(batched[1].token_ids)
    assert hf[0, len(prompts[1]) :].tolist()[:n] == batched[1].token_ids


def test_per_row_max_new_tokens(policy):
    p = _prompt(policy, "planner", "count")
    caps = [3, 9, 5, 1]
    res = policy.generate([GenRequest(ROLES[i % 3], p, SamplingParams(greedy=True, max_new_tokens=c)) for i, c in enumerate(caps)])
    for r, c in zip(res, caps, strict=True):
        assert len(r.token_ids) <= c and len(r.logprobs) == len(r.token_ids)
        if r.finish_reason == "length":
            assert len(r.token_ids) == c
    # rows finish independently: the long row is unaffected by the short ones
    alone = policy.generate([GenRequest("solver", p, SamplingParams(greedy=True, max_new_tokens=9))])[0]
    assert res[1].token_ids == alone.token_ids


def test_stop_string_cuts_after_the_completing_token(policy):
    p = _prompt(policy, "solver", "say something")
    free = policy.generate([GenRequest("solver", p, SamplingParams(greedy=True, max_new_tokens=40))])[0]
    tok = policy.tokenizer("solver")
    ids = free.token_ids
    # pick a printable ASCII token that first appears at position k >= 2
    k = next(
        (k for k in range(2, len(ids)) if 33 <= ids[k] < 127 and chr(ids[k]) not in tok.decode(ids[:k])),
        None,
    )
    assert k is not None, "tiny model produced no usable stop character"
    stop = chr(ids[k])
    res = policy.generate([GenRequest("solver", p, SamplingParams(greedy=True, max_new_tokens=40, stop=["@@never@@", stop]))])[0]
    assert res.finish_reason == "stop"
    assert res.token_ids == ids[: k + 1]  # cut right after the completing token
    assert res.text.endswith(stop) and res.text == tok.decode(res.token_ids, skip_special_tokens=True)
    # a multi-character stop spanning tokens
    stop2 = tok.decode(ids[k - 1 : k + 1])
    if 32 <= ids[k - 1] < 127 and stop2 not in tok.decode(ids[:k]):
        res2 = policy.generate([GenRequest("solver", p, SamplingParams(greedy=True, max_new_tokens=40, stop=[stop2]))])[0]
        assert res2.token_ids == ids[: k + 1] and res2.finish_reason == "stop"


def test_eos_finishes_a_row_and_is_kept():
    model, tok = build_tiny_model()
    eos = tok.eos_token_id
    state = {"on": True}

    def favour_eos(_module, _inp, out):
        if state["on"]:
            out = out.clone()
            out[..., eos] += 100.0
        return out

    model.lm_head.register_forward_hook(favour_eos)
    pol = TeamPolicy(["a", "b"], base=(model, tok))
    p = pol.encode("a", [{"role": "user", "content": "hi"}])
    res = pol.generate([GenRequest("a", p, SamplingParams(max_new_tokens=5)), GenRequest("b", p, GREEDY)])
    for r in res:
        assert r.finish_reason == "eos" and r.token_ids == [eos] and r.text == ""


def test_group_generation_shares_the_prefill(policy):
    p = _prompt(policy, "planner", "tell me a story")
    before = dict(policy.stats)
    res = policy.generate_groups(GenRequest("planner", p, SamplingParams(temperature=1.0, max_new_tokens=8)), 4, seed=0)
    assert len(res) == 4
    assert policy.stats["prefill_tokens"] - before.get("prefill_tokens", 0) == len(p)  # one prefill
    assert policy.stats["prefill_shared"] - before.get("prefill_shared", 0) == 3
    assert len({tuple(r.token_ids) for r in res}) == 4  # n distinct samples
    # n on a request inside a mixed batch: n consecutive results for it
    mixed = policy.generate([GenRequest("solver", p, GREEDY), GenRequest("planner", p, GREEDY, n=3)])
    assert len(mixed) == 4 and mixed[1].token_ids == mixed[2].token_ids == mixed[3].token_ids
    # seeded sampling is reproducible
    again = policy.generate_groups(GenRequest("planner", p, SamplingParams(temperature=1.0, max_new_tokens=8)), 4, seed=0)
    assert [r.token_ids for r in again] == [r.token_ids for r in res]


def test_overlong_prompt_is_handled_and_counted(policy):
    long_prompt = _prompt(policy, "planner", "y" * 240)  # > 256 with max_new_tokens
    short = _prompt(policy, "planner", "ok")
    before = policy.stats["context_overflow"]
    res = policy.generate(
        [GenRequest("planner", long_prompt, SamplingParams(max_new_tokens=16)), GenRequest("solver", short, GREEDY)]
    )
    assert res[0].finish_reason == "context" and res[0].token_ids == [] and res[0].text == ""
    assert res[1].finish_reason in ("length", "eos", "stop") and res[1].token_ids
    assert policy.stats["context_overflow"] == before + 1


# --------------------------------------------------------------------------------------
# training-time log-probs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_recomputed_logprobs_equal_sampling_logprobs(policy, temperature, top_p):
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=10)
    texts = ["first problem", "a much longer second problem statement", "3"]
    reqs = [GenRequest(ROLES[i % 3], _prompt(policy, ROLES[i % 3], t), sp) for i in range(6) for t in [texts[i % 3]]]
    res = policy.generate(reqs, seed=1)
    for role in ROLES:
        mine = [(q, r) for q, r in zip(reqs, res, strict=True) if q.role == role]
        with torch.no_grad():
            st = policy.sequence_logprobs(role, [q.prompt_ids for q, _ in mine], [r.token_ids for _, r in mine], temperature=temperature)
        for k, (_, r) in enumerate(mine):
            n = len(r.token_ids)
            assert st.mask[k].sum().item() == n
            diff = (st.logprobs[k, :n] - torch.tensor(r.logprobs)).abs().max().item()
            assert diff < 1e-4, diff
        assert torch.all(st.entropy[st.mask.bool()] > 0)


def test_eos_is_trainable_when_pad_equals_eos(policy):
    tok = policy.tokenizer("solver")
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos
    prompts = [_prompt(policy, "solver", "a"), _prompt(policy, "solver", "bb")]
    responses = [[65, 66, eos], [67]]
    policy.set_train_role("solver")
    st = policy.sequence_logprobs("solver", prompts, responses)
    assert st.mask.tolist() == [[1, 1, 1], [1, 0, 0]]  # from lengths, not ids != pad
    assert st.logprobs.requires_grad
    params = policy.trainable_parameters("solver")
    for p in params:
        p.grad = None
    (-st.logprobs[0, 2]).backward()  # the EOS position alone
    assert sum(float(p.grad.abs().sum()) for p in params if p.grad is not None) > 0
    # other roles' adapters got no gradient
    assert all(p.grad is None for p in policy.trainable_parameters("planner"))
    for p in params:
        p.grad = None
    policy.set_train_role(None)


def test_reference_disables_adapters(policy):
    p = [_prompt(policy, "planner", "q")]
    r = [[70, 71, 72]]
    with torch.no_grad():
        ref = policy.sequence_logprobs("planner", p, r, reference=True)
        pol = policy.sequence_logprobs("planner", p, r)
        model = policy.base_model("planner")
        ids = torch.tensor([p[0] + r[0]])
        with policy.model("planner").disable_adapter():
            plain = torch.log_softmax(model(ids).logits[0, len(p[0]) - 1 : -1], -1)
    policy.set_train_role(None)  # peft's disable_adapter rewrote requires_grad flags
    assert not ref.logprobs.requires_grad
    expected = plain.gather(-1, torch.tensor(r[0])[:, None]).squeeze(-1)
    assert torch.allclose(ref.logprobs[0], expected, atol=1e-5)
    assert not torch.allclose(ref.logprobs, pol.logprobs, atol=1e-3)


def test_logprobs_are_computed_without_dropout_unless_asked():
    # the sampler never applies dropout: training log-probs must not either, or the PPO
    # ratio of an unmoved policy would be dropout noise instead of 1
    pol = TeamPolicy(["a"], base="tiny-random", lora=LoraSettings(dropout=0.5))
    perturb(pol, scale=0.3)
    p, r = [[257, 10, 65, 66]], [[67, 68, 69, 70]]
    with_grad = pol.sequence_logprobs("a", p, r).logprobs
    assert with_grad.requires_grad
    with torch.no_grad():
        plain = pol.sequence_logprobs("a", p, r).logprobs
        noisy = pol.sequence_logprobs("a", p, r, dropout=True).logprobs
    assert torch.equal(with_grad.detach(), plain)
    assert not torch.allclose(noisy, plain, atol=1e-4)
    assert not pol.model("a").training  # the mode is restored


def test_entropy_without_a_graph_leaves_the_logprob_gradient_exact():
    """entropy_grad=False (no entropy bonus): the same values, the same log-prob gradient, no entropy graph."""
    pol = TeamPolicy(["a"], base="tiny-random")
    perturb(pol, scale=0.3)
    p, r = [[257, 10, 65, 66], [257, 11]], [[67, 68, 69, 70], [71, 72]]
    params = pol.trainable_parameters("a")
    grads, stats = [], []
    for entropy_grad in (True, False):
        pol.model("a").zero_grad()
        st = pol.sequence_logprobs("a", p, r, temperature=0.7, entropy_grad=entropy_grad)
        (st.logprobs.sum() / st.mask.sum()).backward()
        grads.append([q.grad.clone() for q in params])
        stats.append(st)
    assert stats[0].entropy.requires_grad and not stats[1].entropy.requires_grad
    assert torch.equal(stats[0].entropy.detach(), stats[1].entropy) and torch.equal(stats[0].logprobs.detach(), stats[1].logprobs.detach())
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_empty_responses_give_empty_stats(policy):
    st = policy.sequence_logprobs("planner", [[1, 2], [3]], [[], []])
    assert st.logprobs.shape == (2, 0) and st.mask.shape == (2, 0)


# --------------------------------------------------------------------------------------
# modes, roles and adapters
# --------------------------------------------------------------------------------------


def test_set_train_role_freezes_the_other_adapters(policy):
    policy.set_train_role("solver")
    assert all(p.requires_grad for p in policy.trainable_parameters("solver"))
    assert not any(p.requires_grad for r in ("planner", "critic_agent") for p in policy.trainable_parameters(r))
    assert not any(p.requires_grad for p in policy.base_model("solver").parameters() if not any(p is q for r in ROLES for q in policy.trainable_parameters(r)))
    policy.set_train_role(None)
    assert all(p.requires_grad for r in ROLES for p in policy.trainable_parameters(r))


def test_shared_mode_and_named_adapters():
    shared = TeamPolicy(["a", "b", "c"], base="tiny-random", mode="shared")
    ids = {tuple(id(p) for p in shared.trainable_parameters(r)) for r in "abc"}
    assert len(ids) == 1
    named = TeamPolicy(["a", "b", "c"], base="tiny-random", adapters={"a": "x", "b": "x"})
    assert named.adapter_of("a") == named.adapter_of("b") == "x" and named.adapter_of("c") == "c"
    assert [id(p) for p in named.trainable_parameters("a")] == [id(p) for p in named.trainable_parameters("b")]
    assert {id(p) for p in named.trainable_parameters("a")}.isdisjoint(id(p) for p in named.trainable_parameters("c"))


def test_full_mode_is_one_shared_trainable_model_with_frozen_reference():
    pol = TeamPolicy(["a", "b"], base="tiny-random", mode="full")
    pa, pb = pol.trainable_parameters("a"), pol.trainable_parameters("b")
    assert [id(p) for p in pa] == [id(p) for p in pb] and all(p.requires_grad for p in pa)
    p, r = [[257, 10, 65]], [[66, 67]]
    opt = torch.optim.SGD(pa, lr=1.0)
    (-pol.sequence_logprobs("a", p, r).logprobs.sum()).backward()
    opt.step()
    with torch.no_grad():
        new = pol.sequence_logprobs("a", p, r).logprobs
        ref = pol.sequence_logprobs("a", p, r, reference=True).logprobs
    assert not torch.allclose(new, ref)
    g = pol.generate([GenRequest("a", p[0], GREEDY), GenRequest("b", p[0], GREEDY)])
    assert g[0].token_ids == g[1].token_ids  # same weights for both roles


def test_heterogeneous_team_loads_each_base_once():
    m2, t2 = build_tiny_model(seed=7, hidden=32, heads=2, kv_heads=1)
    pol = TeamPolicy(["a", "b", "c"], base={"a": "tiny-random", "b": (m2, t2), "c": "tiny-random"})
    assert len(pol.bases) == 2
    assert pol.base_model("a") is pol.base_model("c") and pol.base_model("a") is not pol.base_model("b")
    p = pol.encode("a", [{"role": "user", "content": "hi"}])
    res = pol.generate([GenRequest(r, p, GREEDY) for r in "abc"])
    alone = [pol.generate([GenRequest(r, p, GREEDY)])[0] for r in "abc"]
    assert [x.token_ids for x in res] == [x.token_ids for x in alone]
    st = pol.sequence_logprobs("b", [p], [res[1].token_ids])
    assert st.logprobs.shape == (1, len(res[1].token_ids))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="mode"):
        TeamPolicy(["a"], base="tiny-random", mode="half")
    with pytest.raises(ValueError, match="distinct"):
        TeamPolicy(["a", "a"], base="tiny-random")
    with pytest.raises(ValueError, match="unknown roles"):
        TeamPolicy(["a"], base={"zzz": "tiny-random"})
    pol = TeamPolicy(["a"], base="tiny-random")
    with pytest.raises(KeyError, match="unknown role"):
        pol.encode("b", [])


# --------------------------------------------------------------------------------------
# persistence
# --------------------------------------------------------------------------------------


def test_save_load_round_trip_is_trainable(tmp_path):
    pol = TeamPolicy(["a", "b"], base="tiny-random", lora=LoraSettings(r=4, alpha=8))
    perturb(pol, seed=3)
    pol.set_train_role("a")  # a frozen 'b' must not stay frozen after load
    pol.save(tmp_path / "ckpt")
    adir = tmp_path / "ckpt" / "adapters" / "b"
    assert (adir / "adapter_model.safetensors").is_file() and (adir / "adapter_config.json").is_file()  # not nested
    assert json.loads((tmp_path / "ckpt" / "policy.json").read_text())["mode"] == "lora"

    fresh = TeamPolicy(["a", "b"], base="tiny-random", lora=LoraSettings(r=4, alpha=8), seed=99)
    fresh.load(tmp_path / "ckpt")
    for role in ("a", "b"):
        for k, v in pol.adapter_state_dict(role).items():
            assert torch.equal(v, fresh.adapter_state_dict(role)[k])
        params = fresh.trainable_parameters(role)
        assert params and all(p.requires_grad for p in params)
    # an optimizer built after load really steps the loaded adapters
    params = [p for p in fresh.trainable_parameters("b") if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    loss = -fresh.sequence_logprobs("b", [[257, 10, 65]], [[66, 67, 68]]).logprobs.sum()
    loss.backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, params, strict=True))
    # and peft can read the saved adapter as trainable too
    from peft import PeftModel

    from marft_algos.models.compat import quiet_peft_checkpointing_probe

    base, _ = build_tiny_model()
    with quiet_peft_checkpointing_probe():  # peft's own deprecated probe, as in TeamPolicy
        pm = PeftModel.from_pretrained(base, str(adir), is_trainable=True)
    assert any(p.requires_grad for p in pm.parameters())


def test_adapter_state_dict_round_trip_and_mismatch():
    pol = TeamPolicy(["a", "b"], base="tiny-random")
    perturb(pol)
    sd = pol.adapter_state_dict("a")
    pol.load_adapter_state_dict("b", sd)
    for k, v in pol.adapter_state_dict("b").items():
        assert torch.equal(v, sd[k])
    with pytest.raises(ValueError):
        pol.load_adapter_state_dict("b", {"nonsense.lora_A.weight": torch.ones(2, 2)})


def test_full_mode_save_load(tmp_path):
    pol = TeamPolicy(["a"], base="tiny-random", mode="full", full_reference=False)
    with torch.no_grad():
        for p in pol.trainable_parameters("a"):
            p.add_(0.01)
    pol.save(tmp_path)
    fresh = TeamPolicy(["a"], base="tiny-random", mode="full", full_reference=False)
    fresh.load(tmp_path)
    assert all(torch.equal(x, y) for x, y in zip(pol.trainable_parameters("a"), fresh.trainable_parameters("a"), strict=True))
    with pytest.raises(ValueError, match="mode"):
        TeamPolicy(["a"], base="tiny-random").load(tmp_path)


# --------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------


def _unique_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def test_four_roles_cost_one_base_plus_four_adapters():
    model, _ = build_tiny_model()
    base_bytes = _unique_bytes(list(model.parameters()) + list(model.buffers()))
    one = TeamPolicy(["a"], base="tiny-random")
    adapter_bytes = sum(p.numel() * p.element_size() for p in one.trainable_parameters("a"))
    four = TeamPolicy(["a", "b", "c", "d"], base="tiny-random")
    models = {id(four.model(r)): four.model(r) for r in four.roles}
    assert len(models) == 1  # one base object
    (m,) = models.values()
    measured = _unique_bytes(list(m.parameters()) + list(m.buffers()))
    assert measured <= (base_bytes + 4 * adapter_bytes) * 1.1
    assert measured >= base_bytes + 4 * adapter_bytes  # all four adapters really exist
    assert four.parameter_bytes()["total"] == measured


def test_sample_next_draws_follow_the_distribution_and_respect_top_p():
    from marft_algos.models.sampling import sample_next

    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    rows = 40_000
    logits = probs.clamp_min(1e-30).log().expand(rows, -1).clone()
    ones = torch.ones(rows)
    gen = torch.Generator().manual_seed(0)
    tokens, lps = sample_next(logits, ones, ones, torch.zeros(rows, dtype=torch.bool), gen)
    freq = torch.bincount(tokens, minlength=6).double() / rows
    # 4 standard errors of a binomial frequency: fails for a biased sampler
    se = (probs.double() * (1 - probs.double()) / rows).sqrt()
    assert torch.all((freq - probs.double()).abs() <= 4 * se + 1e-12), freq
    assert freq[5] == 0  # probability 0 is never drawn
    assert torch.allclose(lps, probs[tokens].log(), atol=1e-5)
    # top-p 0.8 keeps {0, 1, 2} (mass before token 2 is 0.75 < 0.8), drops the rest
    tokens, _ = sample_next(logits, ones, torch.full((rows,), 0.8), torch.zeros(rows, dtype=torch.bool), gen)
    assert set(tokens.tolist()) == {0, 1, 2}
    kept = torch.bincount(tokens, minlength=3).double() / rows
    assert torch.allclose(kept, torch.tensor([4 / 7, 2 / 7, 1 / 7], dtype=torch.float64), atol=0.02)
    # seeded: the same generator seed gives the same draws
    a, _ = sample_next(logits[:64], ones[:64], ones[:64], torch.zeros(64, dtype=torch.bool), torch.Generator().manual_seed(3))
    b, _ = sample_next(logits[:64], ones[:64], ones[:64], torch.zeros(64, dtype=torch.bool), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_the_block_search_draws_what_a_full_inverse_cdf_draws_across_block_edges():
    from marft_algos.models.sampling import _BLOCK, _inverse_cdf

    vocab = 2 * _BLOCK + 44  # the last block is padded
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(512, vocab, generator=g) ** 8  # uneven mass, many near-zero entries
    probs[:, _BLOCK - 3 : _BLOCK + 3] = 0.0  # zero entries on both sides of a block edge (a top-p cut)
    probs[:8] = 0.0
    probs[:4, _BLOCK - 1] = 1.0  # all mass on a block's last entry
    probs[4:8, vocab - 1] = 1.0  # all mass on the vocabulary's last entry (in the padded block)
    drawn = _inverse_cdf(probs, torch.Generator().manual_seed(1))
    # the reference: one float64 cumulative sum over the whole vocabulary, the same uniforms
    cdf = probs.double().cumsum(-1)
    u = torch.rand((512, 1), generator=torch.Generator().manual_seed(1), dtype=torch.float64) * cdf[:, -1:]
    ref = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    assert torch.equal(drawn, ref)
    assert bool((probs.gather(-1, drawn[:, None]) > 0).all())  # never a zero-probability entry
    assert drawn[:4].tolist() == [_BLOCK - 1] * 4 and drawn[4:8].tolist() == [vocab - 1] * 4


def test_single_adapter_decode_with_merged_weights_equals_peft_path(policy, assert_fast_path_exact):
    from marft_algos.models.sampling import SamplingParams as SP

    b = policy._bases[0]
    name = policy.adapter_of("planner")
    weights = [layer.get_base_layer().weight for layer in b.tuner_layers]
    before = [(w.data_ptr(), w.detach().clone()) for w in weights]
    with policy._merged(b, name) as merged:
        assert merged  # plain LoRA layers: folded in
        assert any(not torch.equal(w, c) for w, (_, c) in zip(weights, before, strict=True))
    # restored exactly: the same storage and values
    assert all(w.data_ptr() == ptr and torch.equal(w, c) for w, (ptr, c) in zip(weights, before, strict=True))
    p = _prompt(policy, "planner", "merge me")
    reqs = [GenRequest("planner", p + [65 + i], SP(temperature=1.0, max_new_tokens=12)) for i in range(3)]
    assert_fast_path_exact(policy, "merge_for_decode", reqs, seed=5)


def test_full_weights_load_through_tied_aliases_and_refuse_missing_keys(tmp_path):
    from safetensors.torch import save_file, save_model

    from marft_algos.models.policy import _load_full_weights

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight  # one tensor under two names, saved under one
            self.norm = nn.LayerNorm(3)

    src, dst = Tied(), Tied()
    save_model(src, str(tmp_path / "m.safetensors"))
    _load_full_weights(dst, tmp_path / "m.safetensors", torch.device("cpu"))
    assert torch.equal(dst.emb.weight, src.emb.weight) and dst.head.weight is dst.emb.weight
    save_file({"emb.weight": src.emb.weight.detach().clone()}, str(tmp_path / "part.safetensors"))
    with pytest.raises(RuntimeError, match="Missing key.*norm.weight"):
        _load_full_weights(dst, tmp_path / "part.safetensors", torch.device("cpu"))
