"""The audit's default prompts: deterministic token ids, heterogeneous lengths (5..120).

Most tokens come from the kit models' output alphabet (:func:`tiny_models.hot_token_ids`) so
that the generated text shares n-grams with the prompt and the ngram proposer finds drafts;
some prompts repeat a short pattern, one spans the whole vocabulary.
"""
from __future__ import annotations

import random

from vllm_platform_ext.testing.kit_tokens import hot_token_ids

LENGTHS = (5, 9, 17, 33, 57, 96, 120)


def default_prompts(seed: int = 0, vocab_size: int = 256, hot: int = 8) -> list[list[int]]:
    r = random.Random(seed)
    h = hot_token_ids(hot)

    def rand(n, pool=h):
        return [r.choice(pool) for _ in range(n)]

    def repeat(pattern, n):
        return (pattern * (n // len(pattern) + 1))[:n]

    full = list(range(4, vocab_size))  # no special tokens
    prompts = [
        rand(5),
        repeat(rand(2), 9),
        rand(17),
        repeat(rand(3), 33),
        rand(20, full) + repeat(rand(5), 37),
        rand(40) + repeat(rand(8), 56),
        rand(120),
    ]
    assert [len(p) for p in prompts] == list(LENGTHS)
    return prompts
