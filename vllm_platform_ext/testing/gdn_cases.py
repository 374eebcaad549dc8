"""Random inputs for the GDN ops with the corners of their contract: zero-length rows, null and
padding slots, zero-draft spec rows, accepted counts 1 and k+1, transposed conv-state views; the
named case table the CPU tests, the interpreter worker and the GPU tests share, and named bad
inputs with the word their error must contain. A case is a dict of the op's arguments plus
``op`` (which op it is for)."""
from __future__ import annotations

import torch

# ---------------------------------------------------------------------------------------------
# random cases
# ---------------------------------------------------------------------------------------------


def _qsl(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _conv_state_pool(gen, num_slots: int, dim: int, state_len: int, transposed: bool) -> torch.Tensor:
    if transposed:  # vLLM's default "SD" layout: storage (slots, state_len, dim), passed transposed
        return torch.randn(num_slots, state_len, dim, generator=gen).transpose(1, 2)
    return torch.randn(num_slots, dim, state_len, generator=gen)


def make_conv_prefill_case(seed: int, *, lengths=None, dim=None, width=None, extra_state=None,
                           null_rows=(), init=None, bias=True, activation="silu", transposed=None,
                           null_block_id=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    lengths = list(lengths) if lengths is not None else [r(0, 19) for _ in range(r(1, 4))]
    dim = dim or r(3, 40)
    width = width or r(2, 4)
    extra = r(0, 3) if extra_state is None else extra_state
    N = len(lengths)
    slots = torch.randperm(N + 3, generator=gen)[:N] + 1
    for i in null_rows:
        slots[i] = null_block_id
    if init is None:
        init = (torch.rand(N, generator=gen) < 0.6).tolist()
    transposed = bool(r(0, 1)) if transposed is None else transposed
    return dict(
        op="causal_conv1d_prefill",
        x=torch.randn(sum(lengths), dim, generator=gen),
        weight=torch.randn(dim, width, generator=gen) * 0.5,
        bias=torch.randn(dim, generator=gen) if bias else None,
        conv_states=_conv_state_pool(gen, N + 5, dim, width - 1 + extra, transposed),
        query_start_loc=_qsl(lengths),
        cache_indices=slots.to(torch.int32),
        has_initial_state=torch.tensor(init, dtype=torch.bool),
        activation=activation,
        null_block_id=null_block_id,
    )


def make_conv_update_case(seed: int, *, num_spec=None, lengths=None, accepted=None, dim=None, width=None,
                          null_rows=(), spec=True, bias=True, activation="silu", transposed=None,
                          null_block_id=0) -> dict:
    """Rows of ``lengths`` tokens (each <= num_spec+1) over a conv pool of state_len width-1+num_spec."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    k = r(0, 4) if num_spec is None else num_spec
    width = width or r(2, 4)
    dim = dim or r(3, 40)
    if lengths is None:
        lengths = [r(0, k + 1) if spec else 1 for _ in range(r(1, 5))]
    N = len(lengths)
    if spec:
        accepted = list(accepted) if accepted is not None else [r(1, k + 1) for _ in range(N)]
    slots = torch.randperm(N + 3, generator=gen)[:N] + 1
    for i in null_rows:
        slots[i] = null_block_id
    transposed = bool(r(0, 1)) if transposed is None else transposed
    return dict(
        op="causal_conv1d_update",
        x=torch.randn(sum(lengths), dim, generator=gen),
        conv_states=_conv_state_pool(gen, N + 4, dim, width - 1 + k, transposed),
        weight=torch.randn(dim, width, generator=gen) * 0.5,
        bias=torch.randn(dim, generator=gen) if bias else None,
        activation=activation,
        conv_state_indices=slots.to(torch.int32),
        query_start_loc=_qsl(lengths),
        num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32) if spec else None,
        null_block_id=null_block_id,
    )


def make_recurrent_case(seed: int, *, spec=True, num_spec=None, lengths=None, accepted=None, H=None, HV=None,
                        K=None, V=None, null_rows=(), null_cols=(), init=None, use_qk_l2norm=True,
                        null_block_id=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=gen))  # noqa: E731
    k = r(0, 4) if num_spec is None else num_spec
    H = H or r(1, 2)
    HV = HV or H * r(1, 2)
    K = K or r(3, 20)
    V = V or r(3, 20)
    if lengths is None:
        lengths = [r(0, k + 1) if spec else r(0, 9) for _ in range(r(1, 4))]
    N = len(lengths)
    num_slots = N * (k + 1) + 3
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).to(torch.int32)
    if spec:
        idx = perm[: N * (k + 1)].reshape(N, k + 1).clone()
        accepted = list(accepted) if accepted is not None else [r(1, k + 1) for _ in range(N)]
        for i in null_rows:
            idx[i, accepted[i] - 1] = null_block_id
        for i, c in null_cols:
            idx[i, c] = null_block_id
    else:
        idx = perm[:N].clone()
        for i in null_rows:
            idx[i] = null_block_id
    T = sum(lengths)
    g = -torch.rand(T, HV, generator=gen) * 0.7  # log-decay <= 0
    if init is None:
        init = None if spec else (torch.rand(N, generator=gen) < 0.7).tolist()
    return dict(
        op="recurrent_gated_delta_rule",
        q=torch.randn(T, H, K, generator=gen),
        k=torch.randn(T, H, K, generator=gen),
        v=torch.randn(T, HV, V, generator=gen),
        g=g,
        beta=torch.rand(T, HV, generator=gen),
        scale=float(K) ** -0.5,
        ssm_states=torch.randn(num_slots, HV, V, K, generator=gen) * 0.5,
        query_start_loc=_qsl(lengths),
        state_indices=idx,
        num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32) if spec else None,
        has_initial_state=None if init is None else torch.tensor(init, dtype=torch.bool),
        use_qk_l2norm=use_qk_l2norm,
        null_block_id=null_block_id,
    )


def make_gating_case(seed: int, *, T=None, HV=None) -> dict:
    gen = torch.Generator().manual_seed(seed)
    T = T or int(torch.randint(1, 30, (1,), generator=gen))
    HV = HV or int(torch.randint(1, 9, (1,), generator=gen))
    a = torch.randn(T, HV, generator=gen) * 8
    a[0, 0] = 25.0  # above the softplus threshold
    return dict(op="gdn_gating", A_log=torch.randn(HV, generator=gen), a=a, b=torch.randn(T, HV, generator=gen) * 3,
                dt_bias=torch.randn(HV, generator=gen), softplus_threshold=20.0)


# ---------------------------------------------------------------------------------------------
# the shared case table (CPU tests, the interpreter worker and the GPU tests use the same ids)
# ---------------------------------------------------------------------------------------------


def standard_cases(large: bool = False) -> dict[str, dict]:
    """Named cases covering the contract's corners. ``large`` adds head dims of 128 (GPU only)."""
    C: dict[str, dict] = {}
    P, U, Rc, G = make_conv_prefill_case, make_conv_update_case, make_recurrent_case, make_gating_case
    for s in range(4):
        C[f"prefill-random-{s}"] = P(100 + s)
        C[f"update-random-{s}"] = U(200 + s)
        C[f"rec-spec-random-{s}"] = Rc(300 + s)
        C[f"rec-plain-random-{s}"] = Rc(400 + s, spec=False)
        C[f"gating-random-{s}"] = G(500 + s)
    # conv prefill
    C["prefill-long-rows"] = P(1, lengths=[40, 3, 0, 17], width=4, dim=40)  # several token chunks
    C["prefill-rows-shorter-than-window"] = P(2, lengths=[1, 2, 1], width=4, init=[True, False, True])
    C["prefill-null-slot"] = P(3, lengths=[5, 6, 4], null_rows=(1,))
    C["prefill-no-bias-no-act"] = P(4, bias=False, activation=None)
    C["prefill-width2"] = P(5, width=2, lengths=[3, 1, 7])
    C["prefill-width5-spec-pool"] = P(6, width=5, extra_state=3, lengths=[9, 2])
    C["prefill-transposed-pool"] = P(7, transposed=True, lengths=[6, 5])
    # conv update (spec decode)
    C["update-accepted-1"] = U(10, num_spec=3, lengths=[4, 4, 4], accepted=[1, 1, 1])
    C["update-accepted-k+1"] = U(11, num_spec=3, lengths=[4, 4, 4], accepted=[4, 4, 4])
    C["update-zero-draft-rows"] = U(12, num_spec=3, lengths=[1, 1, 1], accepted=[4, 2, 1])
    C["update-mixed-q"] = U(13, num_spec=4, lengths=[5, 1, 0, 3, 1], accepted=[5, 3, 2, 1, 4], transposed=True)
    C["update-null-slots"] = U(14, num_spec=2, lengths=[3, 2, 1], null_rows=(0, 2))
    C["update-all-empty"] = U(15, num_spec=2, lengths=[0, 0])
    C["update-plain-decode"] = U(16, num_spec=0, spec=False, lengths=[1, 1, 1, 1])
    C["update-plain-decode-spec-pool"] = U(17, num_spec=3, spec=False, lengths=[1, 1, 1])
    C["update-k0-spec"] = U(18, num_spec=0, lengths=[1, 1], accepted=[1, 1])
    C["update-width2"] = U(19, num_spec=3, width=2, lengths=[4, 2])
    C["update-no-bias-no-act"] = U(20, num_spec=2, bias=False, activation=None)
    # recurrent
    C["rec-accepted-1"] = Rc(30, num_spec=3, lengths=[4, 4], accepted=[1, 1])
    C["rec-accepted-k+1"] = Rc(31, num_spec=3, lengths=[4, 4], accepted=[4, 4])
    C["rec-zero-draft-rows"] = Rc(32, num_spec=3, lengths=[1, 1, 1], accepted=[4, 1, 2])
    C["rec-mixed-q"] = Rc(33, num_spec=4, lengths=[5, 1, 0, 2], accepted=[2, 5, 3, 1])
    C["rec-null-read-slot"] = Rc(34, num_spec=2, lengths=[3, 2, 2], accepted=[2, 3, 1], null_rows=(1,))
    C["rec-null-write-column"] = Rc(35, num_spec=3, lengths=[4, 3], accepted=[1, 2], null_cols=((0, 3), (1, 2)))
    C["rec-gva"] = Rc(36, num_spec=2, H=2, HV=6, lengths=[3, 2])
    C["rec-no-l2norm"] = Rc(37, num_spec=2, use_qk_l2norm=False)
    C["rec-plain-decode"] = Rc(38, spec=False, lengths=[1, 1, 1, 1], init=[True, False, True, True])
    C["rec-plain-prefill"] = Rc(39, spec=False, lengths=[7, 0, 12], init=[False, True, True])
    C["rec-plain-null"] = Rc(40, spec=False, lengths=[2, 3], null_rows=(0,))
    C["rec-wide-v"] = Rc(41, num_spec=1, K=24, V=72, lengths=[2, 1])  # several V blocks, K not a power of 2
    C["rec-all-empty"] = Rc(42, num_spec=2, lengths=[0, 0])
    C["gating-threshold"] = G(50, T=4, HV=3)
    # strided metadata views, as vLLM passes them (spec_state_indices_tensor[:, 0], a slice of
    # the block table with its row stride)
    col0 = lambda t: torch.stack([t, t * 0 + 7], 1)[:, 0]  # noqa: E731
    C["update-strided-indices"] = U(21, num_spec=3, lengths=[4, 1, 2], accepted=[2, 4, 1])
    C["update-strided-indices"]["_override"] = {"conv_state_indices": col0, "num_accepted_tokens": col0}
    C["prefill-strided-indices"] = P(22, lengths=[5, 2, 3], init=[True, False, True])
    C["prefill-strided-indices"]["_override"] = {"cache_indices": col0, "has_initial_state": col0}
    C["rec-strided-table"] = Rc(43, num_spec=2, lengths=[3, 1, 2], accepted=[3, 1, 2])
    C["rec-strided-table"]["_override"] = {
        "state_indices": lambda t: torch.cat([t, t * 0 + 7], 1)[:, : t.shape[1]], "num_accepted_tokens": col0}
    C["rec-plain-strided"] = Rc(44, spec=False, lengths=[1, 3], init=[True, True])
    C["rec-plain-strided"]["_override"] = {"state_indices": col0, "has_initial_state": col0}
    if large:
        C["large-update-qwen"] = U(60, num_spec=3, dim=1024, width=4, lengths=[4, 1, 2, 4], transposed=True)
        C["large-prefill-qwen"] = P(61, dim=256, width=4, lengths=[70, 33], transposed=True)
        C["large-rec-spec-128"] = Rc(62, num_spec=3, H=1, HV=2, K=128, V=128, lengths=[4, 1])
        C["large-rec-plain-128"] = Rc(63, spec=False, H=1, HV=2, K=128, V=128, lengths=[1, 2])
    return C


def bad_input_cases() -> dict[str, tuple[dict, str]]:
    """Named bad inputs and a word the error message must contain (case-insensitive)."""
    P, U, Rc, G = make_conv_prefill_case, make_conv_update_case, make_recurrent_case, make_gating_case

    def ov(case, **fns):
        case["_override"] = fns
        return case

    return {
        "update-accepted-0": (U(1, num_spec=2, lengths=[2, 1], accepted=[0, 1]), "num_accepted"),
        "update-accepted-k+2": (U(2, num_spec=2, lengths=[2, 1], accepted=[4, 1]), "num_accepted"),
        "update-too-many-tokens": (U(3, num_spec=1, lengths=[3], accepted=[1]), "tokens"),
        "update-float-indices": (ov(U(4, num_spec=1), conv_state_indices=lambda t: t.float()), "int"),
        "update-x-3d": (ov(U(5, num_spec=1), x=lambda t: t[None]), "x must be"),
        "update-weight-dim": (ov(U(6, num_spec=1), weight=lambda t: torch.cat([t, t[:1]])), "weight"),
        "update-qsl-decreasing": (ov(U(7, num_spec=1, lengths=[1, 1, 1]),
                                    query_start_loc=lambda t: t.flip(0)), "query_start_loc"),
        "prefill-slot-out-of-range": (ov(P(8, lengths=[3, 2]), cache_indices=lambda t: t * 0 + 999), "outside"),
        "prefill-missing-init": (ov(P(9, lengths=[3, 2]), has_initial_state=lambda t: t[:1]), "has_initial_state"),
        "rec-accepted-0": (Rc(10, num_spec=2, lengths=[2, 1], accepted=[0, 1]), "num_accepted"),
        "rec-accepted-S+1": (Rc(11, num_spec=2, lengths=[2, 1], accepted=[1, 4]), "num_accepted"),
        "rec-too-many-tokens": (Rc(12, num_spec=1, lengths=[3], accepted=[1]), "slots"),
        "rec-state-float64": (ov(Rc(13, num_spec=1), ssm_states=lambda t: t.to(torch.float64)), "ssm_states"),
        "rec-heads-not-multiple": (Rc(14, num_spec=1, H=2, HV=3), "multiple"),
        "rec-spec-without-accepted": (ov(Rc(15, num_spec=1), num_accepted_tokens=lambda t: None), "num_accepted"),
        "rec-g-shape": (ov(Rc(16, num_spec=1), g=lambda t: torch.cat([t, t[:, :1]], 1)), "g and beta"),
        "rec-float-indices": (ov(Rc(17, num_spec=1), state_indices=lambda t: t.float()), "int"),
        "rec-slot-out-of-range": (ov(Rc(18, spec=False, lengths=[2]), state_indices=lambda t: t * 0 + 10**6),
                                  "outside"),
        "gating-shape": (ov(G(19, T=3, HV=2), b=lambda t: t[:, :1]), "a and b"),
    }


# Garbage that padded rows (zero tokens: query_start_loc repeats its last value) may carry where a proposer or
# a padded batch leaves them: state/cache indices of -1 (vLLM's old PAD_SLOT_ID), far past the pool, the null
# block; accepted counts of 0, -1 and far past k+1. vLLM pads with the null block and 1 accepted; the ops must
# not read (or write) through any of these.
PAD_INDICES = (-1, 10**6, None)  # None: the case's null block
PAD_ACCEPTED = (0, -1, 10**6)


def _pad_rows(case: dict) -> dict:
    """``case`` with one zero-token row per :data:`PAD_INDICES` entry appended, carrying that index and
    the matching :data:`PAD_ACCEPTED` count."""
    c = dict(case)
    n_pad = len(PAD_INDICES)
    null = case["null_block_id"]
    pads = [null if p is None else p for p in PAD_INDICES]
    qsl = case["query_start_loc"]
    c["query_start_loc"] = torch.cat([qsl, qsl[-1:].repeat(n_pad)])
    for name in ("state_indices", "conv_state_indices", "cache_indices"):
        if name in case:
            t = case[name]
            rows = torch.tensor(pads, dtype=t.dtype)
            if t.dim() == 2:
                rows = rows[:, None].expand(-1, t.shape[1])
            c[name] = torch.cat([t, rows])
    if case.get("num_accepted_tokens") is not None:
        t = case["num_accepted_tokens"]
        c["num_accepted_tokens"] = torch.cat([t, torch.tensor(PAD_ACCEPTED, dtype=t.dtype)])
    if case.get("has_initial_state") is not None:
        t = case["has_initial_state"]
        c["has_initial_state"] = torch.cat([t, torch.ones(n_pad, dtype=t.dtype)])
    return c


def padded_row_cases() -> dict[str, tuple[dict, dict]]:
    """Named (case, the case with garbage-carrying padded rows appended): an op must give the padded case
    the case's outputs and states (the reference runs the case without them)."""
    P, U, Rc = make_conv_prefill_case, make_conv_update_case, make_recurrent_case
    base = {
        "rec-spec": Rc(70, num_spec=3, lengths=[4, 2, 4, 1], accepted=[2, 4, 1, 3]),
        "rec-plain": Rc(72, spec=False, lengths=[1, 5, 1], init=[True, False, True]),
        "update-spec": U(73, num_spec=3, lengths=[4, 1, 3], accepted=[1, 4, 2]),
        "update-spec-transposed": U(74, num_spec=2, lengths=[3, 3], accepted=[2, 3], transposed=True),
        "prefill": P(75, lengths=[6, 2, 9], init=[True, False, True]),
    }
    return {name: (c, _pad_rows(c)) for name, c in base.items()}
