"""Model runner v2's FULL decode graphs carry the TurboQuant route, on each v2 line's own code (0.29-0.34).

v2 is the CUDA default for MTP from 0.29 (``runner_choice``). Under FULL_AND_PIECEWISE graphs (vLLM's default)
a uniform decode batch replays a graph captured from a dummy batch; what the route's builder tag
(``spec_verify.verify_width``) said at that capture is what the graph runs for every replay -- the route's op,
or vLLM's own TurboQuant path (degenerate under FULL graphs, vLLM #40880). Every GPU cell so far ran V1.

The child (``tq_v2_capture_child.py``) runs the line's ``CudaGraphManager._init_candidates`` for MTP k=3 and the
line's ``InputBatch.make_dummy`` for each FULL descriptor, with ``max_query_len`` as that line's capture, its
``prepare_inputs_to_capture`` and its GDN model state's ``prepare_attn`` hand it on (two spellings across the
lines, read from each line's source and asserted here). Every FULL decode graph must be tagged K+1.
"""
from __future__ import annotations

import os

import pytest

from conftest import line_id, run_line_child

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tq_v2_capture_child.py")
K1 = 4  # MTP k=3
# line -> how its capture hands max_query_len on: the descriptor's own (None for decode graphs: the dummy's
# measured width), or the promised width (0.31+, which also fills None with num_tokens for FULL mixed graphs)
CALL = {(0, 29): "descriptor", (0, 30): "descriptor", (0, 31): "promised", (0, 32): "promised",
        (0, 33): "promised", (0, 34): "promised"}


@pytest.mark.parametrize("key", sorted(CALL), ids=line_id)
def test_every_full_decode_graph_is_captured_on_the_route(key):
    got = run_line_child(key, [CHILD])
    assert got["vllm"].startswith(f"{key[0]}.{key[1]}."), got["vllm"]
    assert got["capture_call"] == CALL[key], got
    assert got["prepare_attn_promised"] == got["fills_none"] == (CALL[key] == "promised"), got
    full = got["full"]
    assert len(full) >= 8, full  # request counts 1..64 at K+1 tokens each
    assert {r["uniform"] for r in full} == {K1}, full
    assert all(r["num_tokens"] == r["num_reqs"] * K1 for r in full), full
    bad = [r for r in full if r["tag"] != K1]
    assert not bad, f"vLLM {got['vllm']}: FULL decode graphs captured off the route: {bad}"
