"""Shared set-up of the trainer tests: a tiny in-process model on the toy echo env.

The tiny random model speaks bytes (264 tokens); a random byte sequence is almost never
a vocabulary word, so the team would never see a reward. Like an instruction-tuned model
that already answers in the requested format, the test model gets a fixed output prior:
a frozen bias on its LM head that leaves only the vocabulary letters possible. What the
team then has to LEARN is the coordination (the listener says the speaker's word): at
the start success is ~1/|V| (chance), the optimum is 1.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = list("abcdefgh")  # one-letter words: one token each
PROFILES = [
    {"role": "speaker", "prompt": "Say a word."},
    {"role": "listener", "prompt": "Repeat it.", "with_answer": True},
]
ENV_KWARGS = {"vocabulary": VOCAB, "profiles": PROFILES}
SAMPLING = {"speaker": {"max_new_tokens": 1}, "listener": {"max_new_tokens": 1}}
CHANCE = 1 / len(VOCAB)


def letter_model(seed: int = 0) -> tuple[nn.Module, object]:
    """``build_tiny_model`` whose replies are restricted (by a frozen head bias) to VOCAB."""
    from marft_algos.models import build_tiny_model

    model, tok = build_tiny_model(seed=seed)
    head = model.lm_head
    biased = nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.fill_(-30.0)
        for c in VOCAB:
            biased.bias[tok.convert_tokens_to_ids(c)] = 0.0
    biased.requires_grad_(False)
    model.lm_head = biased
    return model, tok


def letter_policy(seed: int = 0, **kw):
    from marft_algos.models import TeamPolicy

    return TeamPolicy(["speaker", "listener"], base=letter_model(seed), **kw)
