"""Distil a kit checkpoint's MTP draft layer on the target's own greedy continuations.

The kit's ``mtp.*`` tensors start random, so vLLM's MTP drafts are almost never accepted. This
module trains them (only them: the target's weights, its embedding and ``lm_head``, which the
MTP shares, stay frozen) so that the drafts follow the target: offline, on CPU, deterministic.

The torch forward mirrors vLLM's ``Qwen3NextMultiTokenPredictor`` / ``Qwen3_5MultiTokenPredictor``
and the k-step recursion of ``vllm/v1/spec_decode/llm_base_proposer.py``:

* first pass, at every position ``j``: input token ``x[j+1]`` and the target's final hidden state
  ``h[j]`` (after the model's final norm), ``a = fc(cat(pre_fc_norm_embedding(E x), pre_fc_norm_hidden(h)))``,
  one full-attention decoder layer (gated attention: ``q_proj`` gives query and output gate, per-head
  ``q_norm``/``k_norm``, partial neox RoPE at position ``j``, causal over the MTP's own KV), then
  ``mtp.norm``; the shared ``lm_head`` of the last position ``t`` gives draft 1 (for ``x[t+2]``);
* draft step ``s`` = 2..k, at position ``t+s-1``: input the previous draft, hidden the MTP's previous
  *output* (post ``mtp.norm``), attending to the first pass's KV at positions <= t plus the KV
  the earlier draft steps wrote at t+1 .. t+s-1.

Training teacher-forces the previous drafts with the target's tokens (a draft only matters when
every earlier one was accepted) and sums, over the k unrolled steps, the cross-entropy against
the target's own next-token distribution (soft labels: the argmax is the greedy token; the rest
teaches more per position than the hard label). Data: the target's float32 greedy continuations
of seeded random prompts (:func:`training_prompts`), hidden states from the same checkpoint.
``tests/testing/test_mtp_distill.py`` checks determinism and the gain; the engine figures come from
``benchmarks/mtp_acceptance.py``, whose ``--capture`` also compares the drafts vLLM proposes
with :func:`engine_drafts` (the mirror) position by position.
"""
from __future__ import annotations

import math
import random

MTP_PREFIX = "mtp."


def _rms(x, w, eps):
    import torch

    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


def _rope(x, pos, rot: int, theta: float):
    """neox-style RoPE on the first ``rot`` dims of ``x`` [..., T, D] at positions ``pos`` [T]."""
    import torch

    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([f.cos(), f.cos()], -1), torch.cat([f.sin(), f.sin()], -1)
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


class MTPHead:
    """The MTP block as plain tensors (checkpoint names), float32. ``cfg``: the text config dict."""

    def __init__(self, cfg: dict, mtp: dict, embed, lm_head):
        import torch

        self.cfg = cfg
        self.p = {k: v.detach().float().clone().requires_grad_(True) for k, v in mtp.items()}
        self.embed = embed.detach().float()
        self.lm_head = lm_head.detach().float()
        self.eps = cfg["rms_norm_eps"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        rp = cfg.get("rope_parameters") or {}
        self.rot = int(self.hd * rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        self.theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        self.moe = "num_experts" in cfg and f"{MTP_PREFIX}layers.0.mlp.gate.weight" in mtp
        self._t = torch

    def params(self) -> list:
        return list(self.p.values())

    def state_dict(self) -> dict:
        return {k: v.detach().clone() for k, v in self.p.items()}

    def _w(self, name):
        return self.p[MTP_PREFIX + name]

    # --- one decoder layer, split around attention so the draft steps can share KV ----------
    def _fc(self, tok, hid):
        F = self._t.nn.functional
        e = _rms(self.embed[tok], self._w("pre_fc_norm_embedding.weight"), self.eps)
        h = _rms(hid, self._w("pre_fc_norm_hidden.weight"), self.eps)
        return F.linear(self._t.cat([e, h], -1), self._w("fc.weight"))

    def _qkv(self, a, pos):
        """a [B, T, H] -> q [B, nh, T, hd], gate [B, T, nh*hd], k/v [B, nkv, T, hd]."""
        F = self._t.nn.functional
        B, T, _ = a.shape
        L = "layers.0."
        u = _rms(a, self._w(L + "input_layernorm.weight"), self.eps)
        qg = F.linear(u, self._w(L + "self_attn.q_proj.weight")).view(B, T, self.nh, 2 * self.hd)
        q, gate = qg[..., : self.hd], qg[..., self.hd:].reshape(B, T, -1)
        k = F.linear(u, self._w(L + "self_attn.k_proj.weight")).view(B, T, self.nkv, self.hd)
        v = F.linear(u, self._w(L + "self_attn.v_proj.weight")).view(B, T, self.nkv, self.hd)
        q = _rms(q, self._w(L + "self_attn.q_norm.weight"), self.eps).transpose(1, 2)
        k = _rms(k, self._w(L + "self_attn.k_norm.weight"), self.eps).transpose(1, 2)
        q, k = _rope(q, pos, self.rot, self.theta), _rope(k, pos, self.rot, self.theta)
        return q, gate, k, v.transpose(1, 2)

    def _mlp(self, x):
        F, torch = self._t.nn.functional, self._t
        L = MTP_PREFIX + "layers.0.mlp."
        p = self.p

        def ffn(pre, y):
            return F.linear(F.silu(F.linear(y, p[pre + "gate_proj.weight"])) * F.linear(y, p[pre + "up_proj.weight"]),
                            p[pre + "down_proj.weight"])

        if not self.moe:
            return ffn(L, x)
        probs = torch.softmax(F.linear(x, p[L + "gate.weight"]).float(), -1)
        top, idx = torch.topk(probs, self.cfg["num_experts_per_tok"], -1)
        if self.cfg.get("norm_topk_prob", True):
            top = top / top.sum(-1, keepdim=True)
        out = torch.sigmoid(F.linear(x, p[L + "shared_expert_gate.weight"])) * ffn(L + "shared_expert.", x)
        for e in range(self.cfg["num_experts"]):
            w = (top * (idx == e)).sum(-1, keepdim=True)
            out = out + w * ffn(f"{L}experts.{e}.", x)
        return out

    def _finish(self, a, attn, gate):
        """residual + o_proj(attn * sigmoid(gate)), the MLP, ``mtp.norm``; returns (hidden, logits)."""
        F = self._t.nn.functional
        L = "layers.0."
        B, T = a.shape[:2]
        attn = attn.transpose(1, 2).reshape(B, T, -1) * self._t.sigmoid(gate)
        x = a + F.linear(attn, self._w(L + "self_attn.o_proj.weight"))
        x = x + self._mlp(_rms(x, self._w(L + "post_attention_layernorm.weight"), self.eps))
        m = _rms(x, self._w("norm.weight"), self.eps)
        return m, F.linear(m, self.lm_head)

    def unrolled(self, tokens, hidden, k: int = 3, forced: bool = True) -> list:
        """Logits of draft steps 1..k at every position t (teacher-forced).

        ``tokens`` [B, L] long, ``hidden`` [B, L, H] the target's final hidden states. Returns a
        list of k tensors [B, L-1, V]: entry s-1, row t predicts ``tokens[:, t+s+1]`` (rows past
        the end are garbage; mask them). ``forced=False``: each step's input is the previous step's
        argmax at the same row instead (what the engine drafts from position t)."""
        torch = self._t
        B, L = tokens.shape
        T = L - 1
        rep = self.nh // self.nkv
        scale = self.hd ** -0.5
        pos = torch.arange(T)
        nxt = tokens[:, 1:]  # x[t+1]
        a = self._fc(nxt, hidden[:, :T])
        q, gate, k1, v1 = self._qkv(a, pos)
        k1r, v1r = k1.repeat_interleave(rep, 1), v1.repeat_interleave(rep, 1)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        base = (q @ k1r.transpose(-1, -2)) * scale
        attn = torch.softmax(base.masked_fill(~causal, float("-inf")), -1) @ v1r
        m, logits = self._finish(a, attn, gate)
        out = [logits]
        extra_k, extra_v = [], []
        for s in range(2, k + 1):
            # input: x[t+s] (teacher-forced previous draft), hidden: previous step's output, position t+s-1
            if forced:
                tok = torch.cat([tokens[:, s:], tokens[:, -1:].expand(B, s - 1)], 1)[:, :T]
            else:
                tok = out[-1].argmax(-1)
            a = self._fc(tok, m)
            q, gate, ks, vs = self._qkv(a, pos + (s - 1))
            extra_k.append(ks.repeat_interleave(rep, 1))
            extra_v.append(vs.repeat_interleave(rep, 1))
            base = ((q @ k1r.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
            ex = torch.stack([(q * kk).sum(-1) * scale for kk in extra_k], -1)  # [B, nh, T, s-1]
            w = torch.softmax(torch.cat([base, ex], -1), -1)
            attn = w[..., :T] @ v1r + sum(w[..., T + i, None] * extra_v[i] for i in range(s - 1))
            m, logits = self._finish(a, attn, gate)
            out.append(logits)
        return out


def _loss_mask(L: int, starts, k: int):
    """mask[s][b, t]: row t of step s+1 has a target (tokens[t+s+2] exists) that the target model
    generated (t+1 >= prompt length, i.e. x[t+1] is already a generated or last-prompt token)."""
    import torch

    t = torch.arange(L - 1)
    rows = []
    for s in range(k):
        ok = (t + s + 2 <= L - 1)[None, :] & (t[None, :] + 1 >= torch.as_tensor(starts)[:, None])
        rows.append(ok)
    return rows


def training_prompts(n: int, seed: int, hot: int = 8, vocab_size: int = 256,
                     lengths: tuple = (8, 24, 48, 96)) -> list[list[int]]:
    """Seeded random prompts in the style of :mod:`prompts`: hot-letter runs, repeated patterns,
    whole-vocabulary noise; a few lengths (:func:`collect` generates each length as one batch)."""
    from vllm_platform_ext.testing.kit_tokens import hot_token_ids

    r = random.Random(seed)
    h, full = hot_token_ids(hot), list(range(4, vocab_size))
    out = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        style = (i // len(lengths)) % 4
        if style == 0:
            p = [r.choice(h) for _ in range(length)]
        elif style == 1:
            pat = [r.choice(h) for _ in range(r.randint(1, 8))]
            p = (pat * (length // len(pat) + 1))[:length]
        elif style == 2:
            p = [r.choice(full) for _ in range(length // 2)] + [r.choice(h) for _ in range(length - length // 2)]
        else:
            p = [r.choice(full) for _ in range(length)]
        out.append(p)
    return out


def collect(model, prompts: list[list[int]], new_tokens: int):
    """The target's greedy continuations (``model``'s dtype, its KV/recurrent cache) and its final
    hidden states (after the final norm, as vLLM hands them to the drafter), float32.

    Returns one ``(tokens [len(p) + new_tokens], hidden [same, H], len(p), probs [same, V])`` per
    prompt, ``probs[i]`` the target's softmax at position i (the soft label of ``tokens[i+1]``);
    prompts of one length are generated as one batch (no padding)."""
    import torch

    seqs, starts = [], []
    with torch.inference_mode():
        by_len: dict = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(i)
        res = {}
        for n, idx in sorted(by_len.items()):
            x = torch.tensor([prompts[i] for i in idx], dtype=torch.long, device=next(model.parameters()).device)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                                 pad_token_id=0, eos_token_id=None)
            hid = model.model(input_ids=out).last_hidden_state.float()
            probs = torch.softmax(model.lm_head(hid).float(), -1)
            out, hid, probs = out.cpu(), hid.cpu(), probs.cpu()
            for j, i in enumerate(idx):
                res[i] = (out[j], hid[j], n, probs[j])
        for i in range(len(prompts)):
            seqs.append(res[i])
    return seqs


def distill(model_dir: str, mtp: dict, *, seed: int = 0, n_train: int = 128, new_tokens: int = 128,
            steps: int = 300, lr: float = 1e-2, k: int = 3, batch: int = 16, log=None, held=None, data=None,
            device: str = "cpu"):
    """Train ``mtp`` (the ``mtp.*`` tensors) against the target at ``model_dir``; return the new
    tensors (float32) and a summary dict. ``held``: rows of :func:`collect` whose
    :func:`draft_accuracy` ``log`` reports along the way; ``data``: training rows of :func:`collect`
    (default: the target's continuations of ``training_prompts(n_train, seed)``, generated on ``device``;
    the MTP layer trains on the CPU, one thread)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every machine
    try:
        return _distill(model_dir, mtp, seed, n_train, new_tokens, steps, lr, k, batch, log, held, data, device)
    finally:
        torch.set_num_threads(threads)


def _distill(model_dir, mtp, seed, n_train, new_tokens, steps, lr, k, batch, log, held, data, device):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = target.config.to_dict()
    cfg = cfg.get("text_config", cfg)
    sd = target.state_dict()
    embed = next(v for n, v in sd.items() if n.endswith("embed_tokens.weight"))
    head = MTPHead(cfg, mtp, embed, sd["lm_head.weight"])
    if data is None:
        data = collect(target.to(device), training_prompts(n_train, seed), new_tokens)
    del target
    opt = torch.optim.Adam(head.params(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    hist = []
    for step in range(steps):
        idx = torch.randperm(len(data), generator=g)[:batch].tolist()
        loss = _batch_loss(head, [data[i] for i in idx], k)
        opt.zero_grad()
        loss.backward()
        lr_t = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        for pg in opt.param_groups:
            pg["lr"] = lr_t
        opt.step()
        hist.append(float(loss.detach()))
        if log and (step % 50 == 0 or step == steps - 1):
            acc = [round(a, 3) for a in draft_accuracy(head, held, k)] if held else ""
            log(f"step {step} loss {float(loss):.3f} {acc}")
    return head.state_dict(), {"loss_first": hist[0], "loss_last": hist[-1]}


def _batch_loss(head: MTPHead, rows, k: int):
    import torch

    # rows may differ in length: group equal lengths (same prompt length) into one forward
    total, count = 0.0, 0
    by_len: dict = {}
    for r in rows:
        by_len.setdefault(len(r[0]), []).append(r)
    for L, grp in by_len.items():
        tok = torch.stack([r[0] for r in grp])
        hid = torch.stack([r[1] for r in grp])
        masks = _loss_mask(L, [r[2] for r in grp], k)
        probs = torch.stack([r[3] for r in grp])
        for s, logits in enumerate(head.unrolled(tok, hid, k)):
            # soft labels: the target's distribution at position t+s+1 (argmax: tokens[t+s+2])
            soft = torch.cat([probs[:, s + 1:], probs[:, :1].expand(-1, s, -1)], 1)[:, : L - 1]
            ce = -(soft * torch.log_softmax(logits, -1)).sum(-1)
            total = total + (ce * masks[s]).sum()
            count += int(masks[s].sum())
    return total / max(count, 1)


def draft_accuracy(head: MTPHead, rows, k: int = 3) -> list[float]:
    """Per draft step s: the fraction of positions where drafts 1..s all equal the target's tokens
    (greedy acceptance of s drafts); ``1 + sum`` estimates the mean acceptance length."""
    import torch

    hits, n = [0] * k, [0] * k
    with torch.no_grad():
        for r in rows:
            tok, hid, start = r[0][None], r[1][None], r[2]
            L = tok.shape[1]
            masks = _loss_mask(L, [start], k)
            chain, every = None, masks[k - 1]  # rows where all k drafts have a target
            for s, logits in enumerate(head.unrolled(tok, hid, k)):
                tgt = torch.cat([tok[:, s + 2:], tok[:, :1].expand(-1, s + 1)], 1)[:, : L - 1]
                ok = logits.argmax(-1) == tgt
                chain = ok if chain is None else chain & ok
                hits[s] += int((chain & every).sum())
                n[s] += int(every.sum())
    return [h / max(c, 1) for h, c in zip(hits, n)]


def engine_drafts(head: MTPHead, tokens, hidden, t: int, k: int = 3) -> list[int]:
    """The k drafts the engine proposes after accepting ``tokens[t+1]`` at position t."""
    import torch

    with torch.no_grad():
        out = head.unrolled(tokens[None, : t + 2], hidden[None, : t + 2], k, forced=False)
    return [int(o[0, t].argmax()) for o in out]
