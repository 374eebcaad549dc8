"""Train a kit target that recalls, and its MTP layer: the kit's ``target="recall"`` weights.

The random kit targets (``make_tiny_model(target="random")``) say near-random text: a draft layer can
learn little of it (distilled MTP at k=3: mean acceptance length 1.24-1.51,
results/bench/2026-12-01-mtp-distill/), so a speculative cell's accept path (2 or 3 drafts of 3
accepted, the states they leave) ran a handful of times per cell, and a bug there could hide. Real
models are predictable from their context. This module trains the kit target, all of it, on a task
whose answer sits in the context: seeded random prompts that show a cycle of distinct letters
(``c0 c1 ... cL-1 c0 c1 ...``, L = 3..8, after 0..8 tokens of noise), the loss on every token that the
cycle already determines. The model must look the next letter up in its recurrent (GDN) state or its
attention: a state that is wrong by one token gives the wrong letter, and the audit sees it. Then the
MTP layer is distilled on the trained target's own greedy continuations (:mod:`.mtp_distill`), for
the next-next token only (``mtp_k=1``), as Qwen3.5's one MTP layer is trained: vLLM reuses it for
each of k drafts, so later drafts are accepted less often (held out, drafts 1..3 all right at
0.87 / 0.74 / 0.66 of positions for qwen3_5_text; trained on all three steps, 0.98 / 0.97 / 0.93: all
or nothing, the 2-of-3 path then ran zero times in an MTP k=3 cell).

Training is deterministic on one host (one thread, seeded) but float sums differ between CPUs, so
the result is committed (``kit_weights/<kind>-<dims>.safetensors`` with ``kit_weights/manifest.json``:
sha256 of the tensors, the recipe, the figures it reached) and :func:`tiny_models.make_tiny_model`
reads it: the CPU tests, ``verify`` and the GPU cells run the same weights, and a GPU run's tokens
replay on CPU. Rebuild (about 3-5 minutes a kind on 2 cores)::

    python -m vllm_platform_ext.testing.kit_train qwen3_5_text qwen3_next
"""
from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

from vllm_platform_ext.testing import recall_weights
from vllm_platform_ext.testing.recall_weights import manifest, tensors_digest, weights_path

LETTERS = 8  # the cycle's letters: the kit's hot letters (kit_tokens.hot_token_ids)
# (sequence length, batch) of the training steps, in turn: the same tokens a step, and lengths up to
# prompt + generation of the longest kit cell (120 + 128)
SHAPES = ((64, 16), (128, 8), (256, 4))


def recall_sequence(r: random.Random, length: int, letters: int = LETTERS, vocab_size: int = 256):
    """(ids, mask): noise, then a cycle of distinct letters repeated to ``length``; ``mask[i]``: token
    ``i`` follows from what came before (the cycle was shown whole)."""
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids

    L = r.randint(3, min(8, letters))
    cyc = r.sample(hot_token_ids(letters), L)
    pre = [r.randrange(4, vocab_size) for _ in range(r.randint(0, 8))]
    ph = r.randrange(L)
    body = [cyc[(ph + i) % L] for i in range(length - len(pre))]
    return pre + body, [0] * len(pre) + [int(i >= L) for i in range(len(body))]


def _batch(r, length, n):
    import torch

    rows = [recall_sequence(r, length) for _ in range(n)]
    return torch.tensor([x for x, _ in rows]), torch.tensor([m for _, m in rows]).bool()


def recall_accuracy(model, seed: int = 123, n: int = 32, length: int = 128) -> float:
    """Teacher-forced argmax accuracy on the determined tokens of ``n`` held-out recall sequences."""
    import torch

    x, m = _batch(random.Random(seed), length, n)
    dev = next(model.parameters()).device
    x, m = x.to(dev), m.to(dev)
    with torch.no_grad():
        pred = model(input_ids=x).logits[:, :-1].argmax(-1)
    return float((pred == x[:, 1:])[m[:, 1:]].float().mean())


def train_target(model, steps: int = 400, lr: float = 5e-3, seed: int = 0, log=None) -> dict:
    """Train every weight of the HF ``model`` (float32) on recall sequences; return figures."""
    import torch

    torch.manual_seed(seed)
    r = random.Random(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0, loss = time.time(), None
    dev = next(model.parameters()).device
    for step in range(steps):
        length, n = SHAPES[step % len(SHAPES)]
        x, mk = (t.to(dev) for t in _batch(r, length, n))
        logits = model(input_ids=x).logits[:, :-1]
        tgt = x[:, 1:].masked_fill(~mk[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:  # warm-up 30 steps, then cosine to 0
            g["lr"] = lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.step()
        if log and (step % 50 == 0 or step == steps - 1):
            log(f"target step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s")
    model.eval()
    return {"steps": steps, "lr": lr, "loss_last": round(float(loss.detach()), 5), "train_s": round(time.time() - t0)}


def hf_name(name: str) -> str:
    """The transformers model's name of a kit checkpoint tensor (the multimodal kinds' decoder sits under
    ``model.language_model.``; transformers loads it as the text model, ``model.``)."""
    return "model." + name[len("model.language_model."):] if name.startswith("model.language_model.") else name


def _saved_tensors(model, where: Path) -> dict:
    """The model's tensors under the names transformers writes to a checkpoint (save_pretrained
    reverses its load-time conversions, e.g. Qwen3-Next's experts fused on load, one per expert saved)."""
    from safetensors.torch import load_file

    model.to("cpu").save_pretrained(str(where), safe_serialization=True)
    out: dict = {}
    for f in sorted(where.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def build(kind: str, dims: str = "cpu", seed: int = 0, steps: int = 400, lr: float = 5e-3, mtp_steps: int = 300,
          log=print, device: str = "cpu", n_train: int = 128, mtp_k: int = 1) -> dict:
    """Train ``kind``'s target (recall) and distil its MTP layer; write the committed weights and their
    manifest entry; return the entry."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from vllm_platform_ext.testing import mtp_distill
    from vllm_platform_ext.testing.prompts import default_prompts
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same sums in the same order on every run of this host
    try:
        with tempfile.TemporaryDirectory(prefix="vpe-kit-train-") as tmp:
            work = make_tiny_model(kind, Path(tmp) / "m", seed=seed, dims=dims, target="random")
            sd = load_file(str(work / "model.safetensors"))
            model = AutoModelForCausalLM.from_pretrained(str(work), dtype=torch.float32).to(device)
            fig = train_target(model, steps=steps, lr=lr, seed=seed, log=log)
            # the checkpoint's names: transformers' saved ones (it may fuse experts on load and split them on
            # save), else its own (a kit checkpoint that already holds them fused)
            pools = (_saved_tensors(model, Path(tmp) / "saved"), {n: t.detach() for n, t in model.state_dict().items()})
            for n in [n for n in sd if not n.startswith("mtp.")]:
                t = next((p[m] for p in pools for m in (n, hf_name(n)) if m in p and p[m].shape == sd[n].shape), None)
                if t is None:
                    raise RuntimeError(f"the trained {kind} has no tensor {n} of shape {tuple(sd[n].shape)}")
                sd[n] = t.to(torch.bfloat16).contiguous()
            save_file(dict(sorted(sd.items())), str(work / "model.safetensors"), metadata={"format": "pt"})
            del model
            check = AutoModelForCausalLM.from_pretrained(str(work), dtype=torch.float32).eval().to(device)
            fig["recall_accuracy"] = round(recall_accuracy(check), 4)
            # held out: the kit's own audit prompts (testing/prompts.default_prompts), 96 tokens each
            held = mtp_distill.collect(check, default_prompts(0) + default_prompts(1), 96)
            del check
            mtp = {k: v.float() for k, v in sd.items() if k.startswith("mtp.")}
            before = mtp_distill.draft_accuracy(mtp_distill_head(work, mtp), held)
            new, info = mtp_distill.distill(str(work), mtp, seed=seed, steps=mtp_steps, log=log,
                                            n_train=n_train, device=device, k=mtp_k)
            after = mtp_distill.draft_accuracy(mtp_distill_head(work, new), held)
            sd.update({k: v.detach().to(torch.bfloat16).contiguous() for k, v in new.items()})
            recall_weights.KIT_DIR.mkdir(exist_ok=True)
            save_file(dict(sorted(sd.items())), str(weights_path(kind, dims)), metadata={"format": "pt"})
    finally:
        torch.set_num_threads(threads)
    entry = {"sha256": tensors_digest(load_file(str(weights_path(kind, dims)))), "kind": kind, "dims": dims,
             "seed": seed, "target": fig, "mtp": {"steps": mtp_steps, "n_train": n_train, "k": mtp_k, **{k: round(v, 4) for k, v in info.items()},
                                                 "held_chain_accuracy_random": [round(a, 3) for a in before],
                                                 "held_chain_accuracy": [round(a, 3) for a in after]},
             "built": time.strftime("%Y-%m-%d", time.gmtime()), "torch": torch.__version__, "device": device}
    import fcntl

    with open(recall_weights.KIT_DIR / ".manifest.lock", "w") as lock:  # builds of several kinds side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        m = manifest()
        m[f"{kind}-{dims}"] = entry
        recall_weights.MANIFEST.write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    return entry


def mtp_distill_head(model_dir: Path, mtp: dict):
    """A :class:`mtp_distill.MTPHead` of ``mtp`` on the checkpoint at ``model_dir`` (its embedding, lm_head)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from vllm_platform_ext.testing.mtp_distill import MTPHead

    cfg = AutoConfig.from_pretrained(str(model_dir)).to_dict()
    cfg = cfg.get("text_config", cfg)
    sd = load_file(str(Path(model_dir) / "model.safetensors"))
    embed = next(v for n, v in sd.items() if n.endswith("embed_tokens.weight")).float()
    return MTPHead(cfg, {k: v.float() for k, v in mtp.items()}, embed, sd["lm_head.weight"].float())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kinds", nargs="+")
    ap.add_argument("--dims", default="cpu")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--mtp-steps", type=int, default=300)
    ap.add_argument("--device", default="cpu", help="where the target trains (cuda on the GPU machine)")
    ap.add_argument("--n-train", type=int, default=128, help="prompts whose continuations the MTP layer learns")
    ap.add_argument("--mtp-k", type=int, default=1, help="draft steps the MTP layer is trained for")
    a = ap.parse_args(argv)
    for kind in a.kinds:
        print(json.dumps(build(kind, a.dims, steps=a.steps, mtp_steps=a.mtp_steps, device=a.device,
                                    n_train=a.n_train, mtp_k=a.mtp_k), indent=1),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
