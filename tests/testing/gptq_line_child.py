"""Child of tests/testing/test_gptq_multimodal.py: run with a CUDA vLLM line's own Python first on ``PYTHONPATH``
(``ci/tools/vllm_lines.py extract``: the wheel minus its compiled libraries) on this CPU host, it does what that
line's engine does with a GPTQ kit checkpoint up to the kernels:

1. ``EngineArgs(..., speculative_config=MTP k=3, language_model_only=True).create_engine_config()``: the line's
   architecture resolution (``ModelConfig``), its MTP rewrite (``SpeculativeConfig``: the draft's architecture)
   and its GPTQ config from the checkpoint's ``quantization_config``;
2. the target and the MTP draft built by the line's ``initialize_model`` on the CPU (each layer's quant method
   chosen by the line's GPTQ config), their weights read by the line's ``DefaultModelLoader.get_all_weights``
   and loaded by the models' own ``load_weights`` (the ``hf_to_vllm_mapper`` and MTP name rules);
3. every parameter of both models: whether it was loaded, and its value as dequantized by
   ``gptq_kit.dequantize`` (the GPTQ v1 formula) against the float32 twin's tensors, which the test maps to
   vLLM's names on its own (fused layers: their shards in checkpoint order).

Compiled CUDA code the line imports at module level or calls in layer constructors is stubbed (nothing here
runs a kernel: ``process_weights_after_loading`` is not called), and the platform is the line's CUDA platform
answering as one H100 (capability 9.0). Prints one ``RESULT {json}`` line.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
import types

import torch


def _placeholder(*a, **k):
    raise RuntimeError("compiled CUDA code: absent on this host")


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder


def _stub(name: str) -> None:
    s = _Stub(name)
    s.__path__ = []
    sys.modules.setdefault(name, s)


for _m in ("vllm._C_stable_libtorch", "vllm._C", "vllm._moe_C", "vllm.vllm_flash_attn"):
    _stub(_m)
# CUDA-only kernel packages a line's wheel requires and imports while it resolves quantization methods
# (0.23: ``humming``); stubbed only where this venv lacks them
import importlib.util  # noqa: E402

class _StubFinder:
    """Answers the imports of ``packages`` and their submodules with :class:`_Stub` modules."""

    def __init__(self, packages):
        self.packages = tuple(packages)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.packages:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        mod = _Stub(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


_missing = [p for p in ("humming",) if importlib.util.find_spec(p) is None]
if _missing:
    sys.meta_path.append(_StubFinder(_missing))

# the ops layer constructors look up (they would be called in forward only)
INIT_OPS = {"silu_and_mul", "gelu_and_mul", "mul_and_silu", "gelu_tanh_and_mul", "fatrelu_and_mul",
            "swigluoai_and_mul", "rms_norm", "fused_add_rms_norm"}


class _OpsStub:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return _placeholder if name in INIT_OPS else getattr(self._real, name)


def _platform():
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class H100(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA H100 (CPU stand-in)"

        @classmethod
        def device_count(cls):
            return 1

        @classmethod
        def current_device(cls):
            return torch.device("cpu")

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 80 << 30

    platforms._current_platform = H100()
    import vllm._custom_ops as ops

    for name in dir(ops):  # module-level capability probes of the quantization utils
        if name.startswith("cutlass_") and "supports" in name:
            setattr(ops, name, lambda *a, **k: False)
    torch.ops._C = _OpsStub(torch.ops._C)


def _engine_config(path: str):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=path, speculative_config={"method": "mtp", "num_speculative_tokens": 3},
                      language_model_only=True, enforce_eager=True, max_model_len=256).create_engine_config()


def _tensors(model) -> dict:
    """Each leaf module's tensors: ``{module: {"weight": f32} | {"qweight", "qzeros", "scales", "method"}}``."""
    out = {}
    for name, mod in model.named_modules():
        params = dict(mod.named_parameters(recurse=False))
        if "qweight" in params:
            out[name] = {k: params[k].detach().clone() for k in ("qweight", "qzeros", "scales")}
        elif "weight" in params:
            out[name] = {"weight": params["weight"].detach().float().clone()}
        else:
            continue
        out[name]["method"] = type(getattr(mod, "quant_method", None)).__name__
    return out


def _load(cfg, model_config, load_config):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
        model = initialize_model(vllm_config=cfg, model_config=model_config)
    loader = DefaultModelLoader(load_config or cfg.load_config)  # as get_model: the draft may have none
    with set_current_vllm_config(cfg):
        loaded = model.load_weights(loader.get_all_weights(model_config, model))
    names = [n for n, _ in model.named_parameters()]
    return model, {"params": len(names), "not_loaded": sorted(set(names) - set(loaded or ())),
                   "class": type(model).__name__}


def check(path: str, twin: str | None, dist: list) -> dict:
    from vllm_platform_ext.testing.gptq_kit import dequantize

    res: dict = {}
    try:
        cfg = _engine_config(path)
    except Exception as exc:
        return {"config_error": f"{type(exc).__name__}: {exc}"[:3000]}
    res["architectures"] = cfg.model_config.architectures
    res["draft_architectures"] = cfg.speculative_config.draft_model_config.architectures
    res["quant_config"] = type(cfg.quant_config).__name__ if cfg.quant_config else None
    res["quantization"] = cfg.model_config.quantization
    if not dist:
        from vllm.config import set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel

        with set_current_vllm_config(cfg):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{os.environ['CHILD_PORT']}")
            initialize_model_parallel(1, 1)
        dist.append(True)
    models = {"target": (cfg.model_config, cfg.load_config),
              "draft": (cfg.speculative_config.draft_model_config, cfg.speculative_config.draft_load_config)}
    for key, (mc, lc) in models.items():
        try:
            model, info = _load(cfg, mc, lc)
        except Exception as exc:
            res[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
            continue
        mods = {}
        for name, t in _tensors(model).items():
            w = dequantize(t["qweight"], t["qzeros"], t["scales"]) if "qweight" in t else t["weight"]
            mods[name] = {"method": t["method"], "shape": list(w.shape),
                          "group": (t["qweight"].shape[0] * 8 // t["scales"].shape[0]) if "qweight" in t else None}
            if twin:
                torch.save(w, os.path.join(twin, f"{key}--{name}.pt"))
        info["modules"] = mods
        res[key] = info
        del model
    return res


def main() -> None:
    _platform()
    import vllm

    out: dict = {"vllm": vllm.__version__, "checkpoints": {}}
    dist: list = []
    for arg in sys.argv[1:]:
        path, _, dump = arg.partition("=")
        if dump:
            os.makedirs(dump, exist_ok=True)
        out["checkpoints"][path] = check(path, dump or None, dist)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
