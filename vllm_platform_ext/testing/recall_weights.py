"""The recall kit's committed weights (``kit_weights/``): where they are, their manifest, their check;
the tensor digest of any kit checkpoint (a cell run records it, a replay checks it).

:mod:`.kit_train` writes them; :func:`tiny_models.make_tiny_model` (``target="recall"``) reads them."""
from __future__ import annotations

import json
import os
from pathlib import Path

# The committed weights; VPE_KIT_WEIGHTS names another folder of the same form (a GPU window trains the
# GPU kinds there, and the files come back to be committed here).
KIT_DIR = Path(os.environ.get("VPE_KIT_WEIGHTS") or Path(__file__).resolve().parent / "kit_weights")
MANIFEST = KIT_DIR / "manifest.json"


def tensors_digest(sd: dict) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, sorted by name."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(sd):
        _add_tensor(h, name, sd[name])
    return h.hexdigest()


def _add_tensor(h, name: str, t) -> None:
    """One tensor into a digest: its name, dtype, shape and bytes (:func:`tensors_digest`, :func:`checkpoint_digest`)."""
    import torch

    t = t.contiguous()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(-1).view(torch.uint8).numpy().tobytes())


def weights_path(kind: str, dims: str) -> Path:
    return KIT_DIR / f"{kind}-{dims}.safetensors"


def manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}


def load_weights(kind: str, dims: str) -> dict:
    """The committed recall weights of ``kind``/``dims`` (bf16 tensors), checked against the manifest;
    a ValueError naming what is missing or what differs."""
    from safetensors.torch import load_file

    key, path = f"{kind}-{dims}", weights_path(kind, dims)
    entry = manifest().get(key)
    if entry is None or not path.is_file():
        have = ", ".join(sorted(manifest())) or "none"
        raise ValueError(f"no committed recall weights for {key} (have: {have}); build them with "
                         f"python -m vllm_platform_ext.testing.kit_train {kind} --dims {dims}")
    sd = load_file(str(path))
    got = tensors_digest(sd)
    if got != entry["sha256"]:
        raise ValueError(f"{path}: tensors sha256 {got[:16]}... differs from the manifest's {entry['sha256'][:16]}...")
    return sd


def checkpoint_digest(model_dir: str | Path) -> str:
    """sha256 over every tensor of a checkpoint (name, dtype, shape, bytes; sorted by name): the
    same weights give the same digest whatever wrote the config files."""
    import hashlib

    from safetensors import safe_open

    h = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(f.keys()):
                _add_tensor(h, name, f.get_tensor(name))
    return h.hexdigest()
