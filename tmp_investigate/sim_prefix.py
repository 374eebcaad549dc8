"""Drive vLLM's KVCacheManager (hybrid: full attention + mamba 'align') through
A, D, E-salted, E-unsalted the way Scheduler.schedule() does, and print hits.
Usage: python sim_prefix.py [budget] [num_spec] [accept]"""
import sys, types, random
import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, KVCacheConfig,
                                        KVCacheGroupSpec, KVCacheTensor)
from vllm.v1.request import Request

BS = 80
budget = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
K = int(sys.argv[2]) if len(sys.argv) > 2 else 3
accept = int(sys.argv[3]) if len(sys.argv) > 3 else 0
print("vllm", vllm.__version__, "budget", budget, "K", K, "accept", accept)

attn = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
page = attn.page_size_bytes
mamba = MambaSpec(block_size=BS, shapes=((4, 64), (2, 16, 16)), dtypes=(torch.bfloat16, torch.float32),
                  page_size_padded=page, mamba_cache_mode="align", num_speculative_blocks=K)
cfg = KVCacheConfig(num_blocks=2000, kv_cache_tensors=[],
                    kv_cache_groups=[KVCacheGroupSpec(["attn.0"], attn),
                                     KVCacheGroupSpec(["gdn.0", "gdn.1", "gdn.2"], mamba)])
hf = get_hash_fn_by_name("sha256_cbor")
init_none_hash(hf)
hasher = get_request_block_hasher(BS, hf)
kvm = KVCacheManager(cfg, max_model_len=1024, scheduler_block_size=BS, hash_block_size=BS,
                     max_num_batched_tokens=budget, enable_caching=True, use_eagle=False, log_stats=True)
fake = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=BS), use_eagle=False)

def split(req, n, new_local=0):
    return Scheduler._mamba_block_aligned_split(fake, req, n, new_local, 0)

def run(name, prompt, max_tokens=32, salt=None):
    req = Request(name, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), None,
                  cache_salt=salt, block_hasher=hasher)
    kvm.new_step_starts()
    blocks, hit = kvm.get_computed_blocks(req)
    n = min(req.num_tokens - hit, budget)
    n = split(req, n, hit)
    assert kvm.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks) is not None
    req.num_computed_tokens = hit + n
    chunks = [n]
    tok = 1000
    while req.num_computed_tokens < req.num_prompt_tokens:  # more prefill chunks
        kvm.new_step_starts()
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        n = split(req, n)
        assert kvm.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
        chunks.append(n)
    req.append_output_token_ids(tok)
    out = 1
    while out < max_tokens:  # decode with K drafts, `accept` of them accepted
        kvm.new_step_starts()
        req.spec_token_ids = [tok + 1 + i for i in range(K)]
        n = req.num_tokens_with_spec - req.num_computed_tokens
        n = split(req, n)
        assert kvm.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
        acc = min(accept, K, max_tokens - out - 1)
        req.num_computed_tokens -= (K - acc)
        new = [tok + 1 + i for i in range(acc)] + [tok + 50]
        for t in new:
            req.append_output_token_ids(t)
        out += len(new)
        tok += 100
        req.spec_token_ids = []
    kvm.free(req)
    st = kvm.make_prefix_cache_stats()
    print(f"{name:10s} prompt={len(prompt):4d} hit={hit:4d} prefill_chunks={chunks} stats.hits={st.hits}")
    return hit

r = random.Random(1)
n = BS
a = [r.randrange(100, 50000) for _ in range(n - 16)]
d = [r.randrange(100, 50000) for _ in range(2 * n + 8)]
e = d[: 2 * n + 2] + [r.randrange(100, 50000) for _ in range(5)]
run("A", a)
run("D", d)
run("E_salted", e, salt="vpe-no-hit")
run("E", e)
