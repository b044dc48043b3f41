"""Shared set-up of the trainer tests: a tiny in-process model on the toy echo env.

The tiny random model speaks bytes (264 tokens); a random byte sequence is almost never
a vocabulary word, so the team would never see a reward. Like an instruction-tuned model
that already answers in the requested format, the test model gets a fixed output prior:
a frozen bias on its LM head that leaves only the vocabulary letters possible. What the
team then has to LEARN is the coordination (the listener says the speaker's word): at
the start success is ~1/|V| (chance), the optimum is 1.
"""

from __future__ import annotations

from torch import nn

from helpers.restricted import restricted_model

VOCAB = list("abcdefgh")  # one-letter words: one token each
PROFILES = [
    {"role": "speaker", "prompt": "Say a word."},
    {"role": "listener", "prompt": "Repeat it.", "with_answer": True},
]
ENV_KWARGS = {"vocabulary": VOCAB, "profiles": PROFILES}
SAMPLING = {"speaker": {"max_new_tokens": 1}, "listener": {"max_new_tokens": 1}}
CHANCE = 1 / len(VOCAB)
#: the micro-batch cap these tests were written under: the CPU default before 3b6cef2 lowered
#: it to 512, where the tiny runs' minibatches ran in one forward. Splitting them moves the
#: rank-vs-one-process equalities and the fixed-seed learning runs by float order; the cap
#: itself is tested in tests/algos/test_microbatch.py and test_default_memory.py
MICRO_BATCH_TOKENS = 1024


def letter_model(seed: int = 0) -> tuple[nn.Module, object]:
    """``build_tiny_model`` whose replies are restricted (by a frozen head bias) to VOCAB."""
    return restricted_model(VOCAB, seed)


def letter_policy(seed: int = 0, **kw):
    from marft_algos.models import TeamPolicy

    return TeamPolicy(["speaker", "listener"], base=letter_model(seed), **kw)


def echo_config(config_cls, **kw):
    """A ``config_cls`` of a small echo-duo run on :func:`letter_model` (``kw`` overrides)."""
    base = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=4, steps=2, progress=False,
                tensorboard=False, sampling_overrides=SAMPLING, micro_batch_tokens=MICRO_BATCH_TOKENS)
    base.update(kw)
    return config_cls(**base)
