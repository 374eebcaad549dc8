"""Child of ``tests/verify/test_audit_config_lines.py``: one vLLM line's REAL config reader (the line's Python first
on ``PYTHONPATH``, ``conftest.run_line_child``) reads each kit checkpoint as an engine does
(``vllm.transformers_utils.config.get_config``), then the float32 audit's loader runs in the same process:
transformers' ``AutoModelForCausalLM`` as it was (the error, where the line registered its own config class) and
``audit.causal_lm`` (its logits against the same loader's before the line read anything). Prints ``JSON{...}``.

Usage: python hf_config_line_child.py KIND=CHECKPOINT [KIND=CHECKPOINT ...]
"""
from __future__ import annotations

import json
import sys


def main(pairs: list[str]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    import vllm
    from vllm.transformers_utils import config as vllm_config
    from vllm_platform_ext.testing.audit import causal_lm

    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    ckpts = dict(p.split("=", 1) for p in pairs)

    def logits(model):
        with torch.no_grad():
            return model(ids).logits

    before = {k: logits(causal_lm(p, torch.float32).eval()) for k, p in ckpts.items()}
    out = {"file": vllm.__file__, "registered": {}, "plain_error": {}, "ours_max_diff": {}, "ours_class": {}}
    for kind, path in ckpts.items():
        cfg = vllm_config.get_config(path, trust_remote_code=False)
        out["registered"][kind] = type(cfg).__module__.startswith("vllm.")
        try:
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            out["plain_error"][kind] = None
        except Exception as exc:
            out["plain_error"][kind] = f"{type(exc).__name__}: {str(exc)[:200]}"
        model = causal_lm(path, torch.float32).eval()
        out["ours_class"][kind] = type(model).__name__
        out["ours_max_diff"][kind] = float((logits(model) - before[kind]).abs().max())
    return out


if __name__ == "__main__":
    print("JSON" + json.dumps(main(sys.argv[1:])))
