"""``vllm-platform-ext doctor MODEL_PATH --serve-args "..."``: the settings that decide prefix caching of a
hybrid model (mamba "align" mode), as vLLM resolves them for that checkpoint, and what they cost (issue 51).

With prefix caching on, a hybrid model's mamba state is kept only where a prefill chunk ends on a block
boundary, and the block follows the mamba page (640 tokens for the CPU kit with a float32 SSM cache).
vLLM rounds every prefill chunk down to a block boundary *after* decode rows took their share of the step
budget: with ``max_num_batched_tokens`` below one block plus the decode rows of the other requests, a new
prefill gets 0 tokens while anything decodes and requests run one at a time
(patch/mamba_align_split.py: the plugin's ``mamba.align_prefill_budget`` lets it take a sub-block chunk
instead, about two steps a block). The block size is vLLM's own: the target is built on ``meta`` so the
platform's ``update_block_size_for_backend`` sees its layers, as the engine's executor does.
"""
from __future__ import annotations

import shlex

GROUP = "mamba.align_prefill_budget"


def settings(vc, group_applied: bool) -> dict:
    cc, sc, spec = vc.cache_config, vc.scheduler_config, vc.speculative_config
    return {"hybrid": bool(vc.model_config.is_hybrid), "enable_prefix_caching": bool(cc.enable_prefix_caching),
            "mamba_cache_mode": str(cc.mamba_cache_mode), "block_size": int(cc.block_size),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens), "max_num_seqs": int(sc.max_num_seqs),
            "num_speculative_tokens": int(spec.num_speculative_tokens) if spec else 0,
            "speculative_method": spec.method if spec else None,
            "prefix_cache_retention_interval": getattr(cc, "prefix_cache_retention_interval", "absent"),
            "group_applied": bool(group_applied)}


def findings(s: dict) -> tuple[list[str], list[str]]:
    """``(warnings, notes)`` for the resolved settings ``s`` (:func:`settings`)."""
    if not (s["hybrid"] and s["enable_prefix_caching"] and s["mamba_cache_mode"] == "align"):
        return [], []
    block, budget, k = s["block_size"], s["max_num_batched_tokens"], s["num_speculative_tokens"]
    rows = (s["max_num_seqs"] - 1) * (1 + k)  # decode/verify rows of the other requests in one step
    need = block + rows
    warnings, notes = [], []
    if block <= budget < need:
        then = (f"the plugin's {GROUP} is applied here: a prefill then takes the sub-block chunk the budget leaves "
                "(about two steps a block instead of one)" if s["group_applied"] else
                f"without the plugin's {GROUP} (not applied here) it waits until nothing decodes: requests run one "
                "at a time")
        warnings.append(
            f"max_num_batched_tokens={budget} is about one mamba block (block_size {block}) with prefix caching on "
            f"(mamba_cache_mode 'align'): once other requests decode (up to {rows} rows a step: max_num_seqs-1 x "
            f"{1 + k}) a new prefill's chunk rounds down to 0 tokens; {then}. Set --max-num-batched-tokens {need} "
            f"or more (one block plus the decode rows) for whole-block chunks beside decodes")
    if s["prefix_cache_retention_interval"] == 0:
        notes.append(
            "prefix_cache_retention_interval=0 (vLLM's default): a block's mamba state is kept only at a prompt's "
            "last block and at a shared-prefix junction a later request revealed, so a prefix shared by prompts "
            "that go on past it is hit from its third request on; --prefix-cache-retention-interval "
            f"{block} keeps every block boundary a chunk ends on (the second request hits too, more cached states)")
    if k and s["speculative_method"] in ("mtp", "eagle", "eagle3"):
        notes.append(f"with {s['speculative_method']} a hit is one block short of the attention hit (vLLM drops the "
                     f"last matched block): a shared prefix needs {2 * block} tokens or more to hit")
    return warnings, notes


def resolve(path: str, serve_args: list[str]):
    """vLLM's config for ``path`` under ``vllm serve`` arguments ``serve_args``, the block size resolved."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_platform_ext.verify.meta_init import init_distributed

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(["--model", str(path), *serve_args])
    except SystemExit as exc:
        raise ValueError(f"--serve-args {shlex.join(serve_args)!r}: vLLM's parser refused them (exit {exc.code})") \
            from None
    vc = EngineArgs.from_cli_args(args).create_engine_config()
    init_distributed(vc)
    with set_current_vllm_config(vc), torch.device("meta"):
        initialize_model(vllm_config=vc, model_config=vc.model_config)
    current_platform.update_block_size_for_backend(vc)
    return vc


def check(path: str, serve_args: list[str]) -> dict:
    from vllm_platform_ext import patching

    vc = resolve(path, serve_args)
    applied = patching.group_of("vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split") == GROUP
    s = settings(vc, applied)
    warnings, notes = findings(s)
    return {"serve_args": serve_args, "settings": s, "warnings": warnings, "notes": notes}


def format_report(d: dict) -> str:
    s = d["settings"]
    lines = [f"== prefix caching of a hybrid model under `vllm serve {shlex.join(d['serve_args'])}`",
             "  " + ", ".join(f"{k}={v}" for k, v in s.items())]
    lines += [f"  WARNING: {w}" for w in d["warnings"]] + [f"  note: {n}" for n in d["notes"]]
    if not d["warnings"]:
        lines.append("  ok: no prefill is starved by these settings")
    return "\n".join(lines)
