"""spec.cpu_expand_dtype's torch stand-in against vLLM's Triton ``expand_kernel`` written as a Python loop
(per request: its value, ``replace_to`` where it equals ``replace_from``, stored at its first ``MAX_NUM_TOKENS``
positions at most; the rest of the output untouched), at float32, int32 and int64, requests without tokens
included. No vLLM needed; the per-line engine code is tests/patch/test_spec_cpu_dispatch_lines.py's."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from vllm_platform_ext.patch.spec_cpu_sampling import expand_to_tokens


def kernel_loop(out, values, cu, replace_from, replace_to, max_num_tokens):
    start = 0
    for i, end in enumerate(cu.tolist()):
        v = replace_to if values[i].item() == replace_from else values[i].item()
        for j in range(end - start):
            if max_num_tokens is None or j < max_num_tokens:
                out[start + j] = v
        start = end


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_matches_the_kernel(dtype):
    r = random.Random(0)
    pool = [0.0, 0.7, -1.0, 1.25] if dtype.is_floating_point else [0, 1, 5, -1, 3]
    for _ in range(200):
        counts = [r.randrange(0, 6) for _ in range(r.randrange(0, 6))]
        cu = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)
        values = torch.tensor([r.choice(pool) for _ in counts], dtype=dtype)
        cap = r.choice([None, 1, 2, 4, 8])
        got = torch.full((sum(counts) + r.randrange(0, 3),), -9, dtype=dtype)
        want = got.clone()
        expand_to_tokens(got, values, cu, -1, 1, cap)
        kernel_loop(want, values, cu, -1, 1, cap)
        assert torch.equal(got, want), (counts, cap, got, want)


def test_expand_refuses_what_the_kernel_cannot_mean():
    with pytest.raises(ValueError, match="3 values for 2 requests"):
        expand_to_tokens(torch.empty(4), torch.ones(3), torch.tensor([1, 4]), 0, 1)
    with pytest.raises(ValueError, match="not non-decreasing"):
        expand_to_tokens(torch.empty(4), torch.ones(2), torch.tensor([3, 1]), 0, 1)
    with pytest.raises(ValueError, match="5 tokens for an output of 4"):
        expand_to_tokens(torch.empty(4), torch.ones(2), torch.tensor([2, 5]), 0, 1)
