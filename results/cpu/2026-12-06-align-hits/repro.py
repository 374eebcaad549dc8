"""The exploratory runs RESULTS.md quotes (issue 51 setup; 2026-12-06, this host): prints steps, hits, each new request's
hit and the schedule. python repro.py base|mtp BUDGET MAX_TOKENS; env SHARE=1,3[,5] PREFIX=1200 RET=640|none.
Kept as it ran (its model folder under /work/wt/alignhits/tmp)."""
import os, sys, time, json, random
from vllm_platform_ext.testing.engine import apply_engine_env
apply_engine_env()
from vllm_platform_ext.testing.tiny_models import make_tiny_model
from vllm_platform_ext.testing.kit_tokens import hot_token_ids

mode = sys.argv[1] if len(sys.argv) > 1 else "base"
budget = int(sys.argv[2]) if len(sys.argv) > 2 else 0
gen = int(sys.argv[3]) if len(sys.argv) > 3 else 64
model = make_tiny_model("qwen3_next", "/work/wt/alignhits/tmp/qn4k", max_positions=4096, target="recall")
from vllm import LLM, SamplingParams
if os.environ.get("DBG"): exec(open("/work/wt/alignhits/tmp/dbg.py").read())
kw = dict(model=str(model), dtype="bfloat16", max_model_len=4096, max_num_seqs=8, enable_chunked_prefill=True,
          enforce_eager=True, enable_prefix_caching=True, disable_log_stats=False, seed=0)
if budget: kw["max_num_batched_tokens"] = budget
if os.environ.get("RET"): kw["prefix_cache_retention_interval"] = None if os.environ["RET"]=="none" else int(os.environ["RET"])
if mode == "mtp": kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 3}
llm = LLM(**kw)
cc = llm.llm_engine.vllm_config.cache_config
sc = llm.llm_engine.vllm_config.scheduler_config
B = cc.block_size
print("block", B, "mode", cc.mamba_cache_mode, "budget", sc.max_num_batched_tokens, "blocks", cc.num_gpu_blocks,
      "async", llm.llm_engine.vllm_config.scheduler_config.async_scheduling, flush=True)
core = llm.llm_engine.engine_core.engine_core
sched = core.scheduler
print("eagle", sched.use_eagle_block_drop, "ret", cc.prefix_cache_retention_interval)
print("hash_block_size", sched.hash_block_size, "partial", sched.mamba_partial_cache_hit, "eagle_drop", sched.use_eagle_block_drop)
steps = []
orig = sched.schedule
def schedule(*a, **k):
    out = orig(*a, **k)
    steps.append({"n": dict(out.num_scheduled_tokens),
                  "new": {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}})
    return out
sched.schedule = schedule
r = random.Random(0)
hot = hot_token_ids(8)
full = list(range(4, 250))
PL = int(os.environ.get("PREFIX", "1200"))
prefix = [r.choice(hot) for _ in range(PL)]
lens = [2000, 1500, 2600, 1800, 3000, 1700]
prompts = []
for i, L in enumerate(lens):
    if i in tuple(int(x) for x in os.environ.get("SHARE","1,3").split(",")):
        prompts.append(prefix + [r.choice(hot) for _ in range(L - PL)])
    else:
        prompts.append([r.choice(hot) for _ in range(L)])
arrive = [0, 0, 3, 6, 9, 12]  # engine steps at which each request arrives
sp = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True, detokenize=False)
eng = llm.llm_engine
done = {}
t0 = time.perf_counter()
first = {}
added = set(); step = 0
while len(done) < len(prompts):
    for i, a in enumerate(arrive):
        if i not in added and step >= a:
            eng.add_request(f"r{i}", {"prompt_token_ids": prompts[i]}, sp); added.add(i)
    outs = eng.step(); step += 1
    for o in outs:
        rid = o.request_id
        if rid not in first and len(o.outputs[0].token_ids) > 0: first[rid] = (step, time.perf_counter() - t0)
        if o.finished: done[rid] = list(o.outputs[0].token_ids)
dt = time.perf_counter() - t0
m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
print("steps", step, "sched steps", len(steps), "wall", round(dt, 1))
print("hits", m.get("vllm:prefix_cache_hits"), "queries", m.get("vllm:prefix_cache_queries"), "preempt", m.get("vllm:num_preemptions"))
print("new-req computed", [s["new"] for s in steps if s["new"]])
multi = sum(1 for s in steps if len(s["n"]) > 1)
print("steps with >1 req", multi, "max reqs/step", max(len(s["n"]) for s in steps))
print("first token (step, s)", first)
# schedule trace compressed
prev = None
for i, s in enumerate(steps):
    key = tuple(sorted(s["n"].items()))
    sig = tuple(sorted((k, v if v > 4 else 'd') for k, v in s["n"].items()))
    if sig != prev: print(i, s["n"]); prev = sig
