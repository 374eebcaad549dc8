"""Gluon (explicit-layout Triton) verify kernel for every TurboQuant preset at head dim 256:
``turboquant_k8v4`` on SM 8.9+ (fp8 ``cvt``), the MSE presets (``4bit_nc``, ``k3v4_nc``,
``3bit_nc``) on SM 8.0+.

Same job and output as :func:`kernels_v2._tq_verify_v2` (split-KV partials in the
workspace, combined by ``_tq_verify_stage2`` with ``SPLIT4``), but every layout is chosen here:

* raw key words (4 fp8 bytes) and value words (2 x 4 nibbles) go global -> shared memory with
  ``cp.async`` (STAGES-deep ring) and come out of shared memory straight in the MMA operand
  layout, where they are converted in registers (no dequantized tile is written anywhere);
* the query (any float dtype) is read once per program, scaled, converted to fp16 and put in
  shared memory with its head dim in the order of the key decodes (``_load_query``; the host's
  ``triton_verify.gluon_query_order`` is the same order), then read per 16-wide chunk, so no
  warp holds the whole query in registers and the host launches no query kernels;
* softmax weights go through a small shared tile to the second product;
* the rows' running maxima cross the warps once per tile; their sums (of the weights and of the
  zero points) are kept per score element (folded over the positions a thread holds) and reduced
  over the positions once per program;
* warps split both the rows and the tile's positions (``WM x WN``).

:func:`_tq_verify_t_gluon` is the same computation transposed (S^T = K Q^T, O^T = V^T P^T): the
query rows are the tensor cores' N in groups of 8, so plain decode's 6-8 rows per KV head do not
pay for 16-row tiles; the host picks it up to ``TRANSPOSED_ROWS`` rows. Its ``WG`` form (SM 9.0)
runs the same steps on asynchronous Hopper warpgroup MMAs (query and softmax weights as their
shared-memory operands); the host picks it by shape rule (``WGMMA``, up to ``WG_ROWS`` rows).

MSE presets: slots (262/230/198 bytes) are only 2-byte aligned, so their tiles go global ->
registers by 16-bit loads and are written to shared memory as index words, 3-bit groups widened
to nibbles on the way (then every index field has element 4h+e at nibble e of halfword h, like
4-bit fields). Keys become fp16 centroids in the operand layout through byte permutes over the
codebook held in registers, a whole index word (8 centroids) per lookup (``ptx.LUT8W`` /
``LUT8SW`` / ``LUT16W``; the query is ordered to match their output pairs); the norm correction's
sum of squares is accumulated next to the products (``ptx.SQ_ACC``). Value words of every preset
decode four nibble positions per call (``ptx.NIB4W`` / ``NIB3W``).

Imports only torch and Triton; :data:`AVAILABLE` is False where Triton has no Gluon.
"""
from __future__ import annotations

from vllm_platform_ext.ops.turboquant.gluon_common import AVAILABLE

if AVAILABLE:
    from vllm_platform_ext.ops.turboquant.gluon_common import (  # noqa: F401 (globals of the kernels)
        _acc_zeros, _as_halfwords, _barrier, _fence_async_shared, _fp8_wide, _hopper, _load_query, _lut_tables,
        _lut_wide, _nib_wide, _row_state, _softmax_tile, _split_range, _sq_acc, _stage_prologue, _stage_tile,
        _store_partial, _wg_wait, cp, gl, gluon, mma_v2,
    )

    @gluon.jit
    def _tq_verify_gluon(
        Q, KV, BT, SEQ, LUT, MID,
        stride_qn, stride_qh,
        stride_cb, stride_cp, stride_ch,  # in KV elements (32-bit words for k8v4, 16-bit for MSE)
        stride_bt,
        stride_mr, stride_mh, stride_ms,
        qk_scale, K1, NUM_SPLITS,
        G: gl.constexpr, BLOCK_M: gl.constexpr, M_CHUNKS: gl.constexpr,
        PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W: gl.constexpr, SZ_W: gl.constexpr,
        WM: gl.constexpr, WN: gl.constexpr, STAGES: gl.constexpr,
        KEY_BITS: gl.constexpr = 8, VAL_BITS: gl.constexpr = 4, NORM_W: gl.constexpr = 0,
        NORM_CORRECTION: gl.constexpr = False, PREFETCH: gl.constexpr = False, FOLD: gl.constexpr = False,
        MIN_TILES: gl.constexpr = 1, BASE_SPLITS: gl.constexpr = 32,
    ):
        """KEY_BITS 8: fp8 (e4nv) keys, KV an int32 view, tiles staged by cp.async (STAGES deep;
        PREFETCH: block-table entries read one issue ahead); field offsets VAL_W / SZ_W in words. KEY_BITS 3/4: MSE keys (centroid indices, codebook
        bytes in LUT), KV an int16 view (slots are only 2-byte aligned), tiles staged through
        registers by 16-bit loads (PREFETCH: the next tile's block-table entries are read while
        this tile is staged); offsets NORM_W / VAL_W / SZ_W in halfwords. FOLD (4-bit keys of a
        symmetric codebook): LUT holds the 8 positive entries, indices are folded when staged."""
        D: gl.constexpr = 256
        D4: gl.constexpr = 64
        NW: gl.constexpr = WM * WN
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WM, WN], instr_shape=[16, 8])
        opA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        opB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        # copies: a warp covers 4 rows x 8 words per instruction, so each thread owns few rows
        LW: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [NW, 1], [1, 0])
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        ROW: gl.constexpr = gl.SliceLayout(1, mma)
        COL: gl.constexpr = gl.SliceLayout(0, mma)
        # swizzles (XOR of 16/32-byte units by row) keep the operand reads free of bank conflicts:
        # fp8 key rows of 64 words in 8-word units; index rows (32 words = 64 halfwords) in 16-byte
        # units, seen as int32 when written and as int16 by the ldmatrix reads
        sh_w: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_v32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        sh_v16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_s: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sh_h: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        if KEY_BITS != 8:
            gl.static_assert(STAGES == 1, "MSE tiles are staged through registers: one shared buffer")
        HALF: gl.constexpr = 2.0 ** (VAL_BITS - 1)  # value index centring: 8 (4-bit), 4 (3-bit)

        b = gl.program_id(1)
        kvh = gl.program_id(0) // M_CHUNKS
        mc = gl.program_id(0) % M_CHUNKS
        sid = gl.program_id(2)
        seq_len, start, end, n_tiles = _split_range(SEQ, b, sid, NUM_SPLITS, BLOCK_N, MIN_TILES, BASE_SPLITS)

        # query -> shared memory, four sub-tiles [BLOCK_M, 64]
        q_smem = gl.allocate_shared_memory(gl.float16, [4, BLOCK_M, D4], sh_h)
        _load_query(Q, q_smem, mc * BLOCK_M, BLOCK_M, b, kvh, K1, G, stride_qn, stride_qh, qk_scale, LQ)

        if KEY_BITS != 8:
            kw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4 // 2], sh_v32)
            nr_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sh_s)
        else:
            kw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4], sh_w)
            nr_smem = gl.allocate_shared_memory(gl.float32, [1], sh_s)  # (no key norms: unused)
        vw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4 // 2], sh_v32)
        sz_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], sh_s)
        p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, BLOCK_N], sh_h)

        bt_row = BT + b.to(gl.int64) * stride_bt
        kv_off = kvh.to(gl.int64) * stride_ch
        blk_n = _stage_prologue(KV, bt_row, kv_off, stride_cb, stride_cp, start, end, n_tiles, kw_smem, vw_smem, sz_smem,
                                PAGE, BLOCK_N, VAL_W, SZ_W, LW, STAGES, KEY_BITS, PREFETCH)

        rows = mc * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW)
        lim = seq_len - K1 + 1 + rows // G
        m_i, l_i, r_i, c_i = _row_state(BLOCK_M, ROW, [BLOCK_M, BLOCK_N], mma, 1)
        acc0, acc1, acc2, acc3 = _acc_zeros(BLOCK_M, D4, mma)

        for it in range(0, n_tiles):
            tile_start = start + it * BLOCK_N
            st, blk_n = _stage_tile(KV, bt_row, blk_n, kv_off, stride_cb, stride_cp, it, start, end, n_tiles, kw_smem,
                                    vw_smem, sz_smem, nr_smem, PAGE, BLOCK_N, KEY_BITS, VAL_BITS, NORM_W, VAL_W, SZ_W,
                                    LW, FOLD, STAGES, PREFETCH)
            if KEY_BITS != 8:
                kwt = _as_halfwords(kw_smem.index(0), BLOCK_N, sh_v16).permute([1, 0])
            else:
                kwt = kw_smem.index(st).permute([1, 0])  # [64 words, BLOCK_N]
            s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
            if KEY_BITS != 8:
                ssq = gl.zeros([16, BLOCK_N], gl.float32, layout=opB)
                # codebook tables reloaded per tile (L1 hits): not live while the tile is staged
                t0, t1, t2, t3, t4, t5, t6, t7 = _lut_tables(LUT, gl.full([16, BLOCK_N], 0, gl.int32, layout=opB),
                                                            KEY_BITS, FOLD)
                for c in gl.static_range(D4 // 16):
                    x = kwt.slice(16 * c, 16, dim=0).load(opB)  # [16 halfwords, BLOCK_N]
                    # sub-tile m pairs the word's halfword m // 2, nibbles 2 (m % 2) and 2 (m % 2) + 1
                    # (the host orders the query to match: triton_verify.gluon_query_order)
                    k0, k1, k2, k3 = _lut_wide(x, t0, t1, t2, t3, t4, t5, t6, t7, KEY_BITS, FOLD)
                    s = mma_v2(q_smem.index(0).slice(16 * c, 16, dim=1).load(opA), k0, s)
                    s = mma_v2(q_smem.index(1).slice(16 * c, 16, dim=1).load(opA), k1, s)
                    s = mma_v2(q_smem.index(2).slice(16 * c, 16, dim=1).load(opA), k2, s)
                    s = mma_v2(q_smem.index(3).slice(16 * c, 16, dim=1).load(opA), k3, s)
                    if NORM_CORRECTION:  # sum of squares: four values per fp16 partial, then fp32
                        sq = _sq_acc(k3, _sq_acc(k2, _sq_acc(k1, _sq_acc(k0, gl.zeros_like(k0)))))
                        ssq += sq.to(gl.float32)
                k_mul = nr_smem.load(COL)
                if NORM_CORRECTION:
                    k_mul = k_mul / gl.sqrt(gl.convert_layout(gl.sum(ssq, axis=0), COL) + 1e-16)
                s = s * k_mul[None, :]
            else:
                for c in gl.static_range(D4 // 16):
                    w = kwt.slice(16 * c, 16, dim=0).load(opB)
                    k0, k1, k2, k3 = _fp8_wide(w)  # (query ordered to match: triton_verify.gluon_query_order)
                    s = mma_v2(q_smem.index(0).slice(16 * c, 16, dim=1).load(opA), k0, s)
                    s = mma_v2(q_smem.index(1).slice(16 * c, 16, dim=1).load(opA), k1, s)
                    s = mma_v2(q_smem.index(2).slice(16 * c, 16, dim=1).load(opA), k2, s)
                    s = mma_v2(q_smem.index(3).slice(16 * c, 16, dim=1).load(opA), k3, s)
            n = tile_start + gl.arange(0, BLOCK_N, layout=COL)
            visible = (n < end)[None, :] & (n[None, :] < lim[:, None])
            sz = sz_smem.index(st).load(COL)
            v_scale = (sz & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            v_zero = (sz >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            w16, m_i, l_i, r_i, c_i, f = _softmax_tile(s, visible, v_scale, v_zero, m_i, l_i, r_i, c_i, HALF, 1)
            f = f[:, None]
            acc0 = acc0 * f
            acc1 = acc1 * f
            acc2 = acc2 * f
            acc3 = acc3 * f
            p_smem.store(w16)
            _barrier()
            vh = _as_halfwords(vw_smem.index(st), BLOCK_N, sh_v16)
            for kc in gl.static_range(BLOCK_N // 16):
                pa = p_smem.slice(16 * kc, 16, dim=1).load(opA)
                h = vh.slice(16 * kc, 16, dim=0).load(opB)
                v0, v1, v2, v3 = _nib_wide(h, VAL_BITS)
                acc0 = mma_v2(pa, v0, acc0)
                acc1 = mma_v2(pa, v1, acc1)
                acc2 = mma_v2(pa, v2, acc2)
                acc3 = mma_v2(pa, v3, acc3)
            _barrier()
        if KEY_BITS == 8:
            cp.wait_group(0)

        _store_partial(MID, acc0, acc1, acc2, acc3, m_i, l_i, r_i, c_i, rows, b, kvh, sid, K1, G, stride_mr, stride_mh,
                       stride_ms, COL, 1)

    @gluon.constexpr_function
    def _t_mma_layout(WG, NW, R):
        """The transposed kernel's accumulator layout for a row group of R rows: Hopper warpgroup
        MMA (instruction N = R) or mma.sync 16 x 8 tiles, warps along the positions (M)."""
        if WG:
            return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, R, 16])
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])

    @gluon.constexpr_function
    def _t_operand_smem(WG, ROW_BYTES):
        """Shared layout of the transposed kernel's B operands (query, softmax weights; fp16 rows of
        ROW_BYTES): the warpgroup MMAs' swizzle (128 bytes, or the row when shorter), else a
        16-byte-unit XOR swizzle for ldmatrix."""
        if WG:
            return gl.NVMMASharedLayout(swizzle_byte_width=min(128, ROW_BYTES), element_bitwidth=16, rank=2)
        return gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])

    @gluon.jit
    def _mma_t(a, b_smem, acc, opA: gl.constexpr, opB: gl.constexpr, WG: gl.constexpr):
        """acc + a @ b, b [K, N] a shared-memory view: a Hopper warpgroup MMA left in flight (WG;
        ``_wg_wait`` collects it), else mma.sync on b loaded in the operand layout."""
        if WG:
            return _hopper.warpgroup_mma(gl.convert_layout(a, opA), b_smem, acc, is_async=True)
        else:
            return mma_v2(a, b_smem.load(opB), acc)

    @gluon.jit
    def _store_weights(p_smem, w, WG: gl.constexpr):
        """A tile's softmax weights w [positions, rows] -> shared memory: as P [rows, positions]
        for the warpgroup MMAs (WG; the caller fences both row groups' stores once for their
        reads), else as they are."""
        if WG:
            p_smem.permute([1, 0]).store(w)
        else:
            p_smem.store(w)

    @gluon.jit
    def _weights_chunk(p_smem, kc: gl.constexpr, WG: gl.constexpr):
        """Positions 16 kc .. 16 kc + 15 of the stored weights as the B operand view [16, rows]."""
        if WG:
            return p_smem.slice(16 * kc, 16, dim=1).permute([1, 0])
        else:
            return p_smem.slice(16 * kc, 16, dim=0)

    @gluon.jit
    def _tq_verify_t_gluon(
        Q, KV, BT, SEQ, LUT, MID,
        stride_qn, stride_qh,
        stride_cb, stride_cp, stride_ch,
        stride_bt,
        stride_mr, stride_mh, stride_ms,
        qk_scale, K1, NUM_SPLITS,
        G: gl.constexpr, RA: gl.constexpr, RB: gl.constexpr,
        PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W: gl.constexpr, SZ_W: gl.constexpr,
        NW: gl.constexpr, STAGES: gl.constexpr,
        KEY_BITS: gl.constexpr = 8, VAL_BITS: gl.constexpr = 4, NORM_W: gl.constexpr = 0,
        NORM_CORRECTION: gl.constexpr = False, PREFETCH: gl.constexpr = False, FOLD: gl.constexpr = False,
        WG: gl.constexpr = False, WG_DEPTH: gl.constexpr = 1, MIN_TILES: gl.constexpr = 1,
        BASE_SPLITS: gl.constexpr = 32,
    ):
        """:func:`_tq_verify_gluon` transposed: S^T = K Q^T and O^T = V^T P^T, so the query rows of a
        (request, KV head) are the tensor cores' N, in multiples of 8 instead of 16-row tiles: two
        row groups of RA and RB rows (powers of two, RB may be 0), e.g. 6 rows (plain decode, GQA 6)
        as 8, 24 (K+1 = 4) as 16 + 8, 36 (K+1 = 6) as 32 + 8 instead of 16, 32 and 64. Positions
        (and the value head dim) are the M side, split over NW warps; each tile's key and value words
        are decoded once, as A operands, for both groups; the query and the softmax weights are the
        B operands (shared memory). Same inputs, staging, decodes, query order and workspace output
        as the row-major kernel.

        WG (SM 9.0, NW = 4: one warpgroup): Hopper warpgroup MMAs instead of mma.sync. The decoded
        words stay the register A operands (M = 64 positions or value head-dim rows, the same
        per-warp rows as mma.sync's); the query and the softmax weights are read by the MMAs from
        shared memory (``NVMMASharedLayout``; the weights stored as P [rows, positions]) with N = RA
        or RB rows per instruction. The MMAs of up to WG_DEPTH earlier 16-wide chunks stay in flight
        while the next chunk is decoded."""
        D4: gl.constexpr = 64
        if WG:
            gl.static_assert(NW == 4, "warpgroup MMAs: one warpgroup of 4 warps")
            gl.static_assert(BLOCK_N % 64 == 0, "warpgroup MMAs: M (the tile's positions) a multiple of 64")
        mma: gl.constexpr = _t_mma_layout(WG, NW, RA)
        mma_b: gl.constexpr = _t_mma_layout(WG, NW, RB if RB > 0 else 8)
        sh_h: gl.constexpr = _t_operand_smem(WG, 2 * D4)  # the query (sub-tiles of 64)
        sh_p: gl.constexpr = _t_operand_smem(WG, 2 * BLOCK_N)  # the softmax weights (WG: P [rows, BLOCK_N])
        opA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        opA_b: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_b, k_width=2)
        opB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        opB_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_b, k_width=2)
        LW: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [NW, 1], [1, 0])
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        POS: gl.constexpr = gl.SliceLayout(1, mma)  # along the positions / value head dim (M)
        POS_B: gl.constexpr = gl.SliceLayout(1, mma_b)  # (the same distribution)
        QR: gl.constexpr = gl.SliceLayout(0, mma)  # along the query rows (N)
        QR_B: gl.constexpr = gl.SliceLayout(0, mma_b)
        sh_w: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_v32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        sh_v16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_s: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        if KEY_BITS != 8:
            gl.static_assert(STAGES == 1, "MSE tiles are staged through registers: one shared buffer")
        HALF: gl.constexpr = 2.0 ** (VAL_BITS - 1)

        b = gl.program_id(1)
        kvh = gl.program_id(0)
        sid = gl.program_id(2)
        seq_len, start, end, n_tiles = _split_range(SEQ, b, sid, NUM_SPLITS, BLOCK_N, MIN_TILES, BASE_SPLITS)

        qa_smem = gl.allocate_shared_memory(gl.float16, [4, RA, D4], sh_h)
        _load_query(Q, qa_smem, 0, RA, b, kvh, K1, G, stride_qn, stride_qh, qk_scale, LQ)
        if RB > 0:
            qb_smem = gl.allocate_shared_memory(gl.float16, [4, RB, D4], sh_h)
            _load_query(Q, qb_smem, RA, RB, b, kvh, K1, G, stride_qn, stride_qh, qk_scale, LQ)

        if KEY_BITS != 8:
            kw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4 // 2], sh_v32)
            nr_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sh_s)
        else:
            kw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4], sh_w)
            nr_smem = gl.allocate_shared_memory(gl.float32, [1], sh_s)  # (no key norms: unused)
        vw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4 // 2], sh_v32)
        sz_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], sh_s)
        if WG:  # P [rows, positions]: positions contiguous (the MMAs' K-major B operand)
            pa_smem = gl.allocate_shared_memory(gl.float16, [RA, BLOCK_N], sh_p)
            if RB > 0:
                pb_smem = gl.allocate_shared_memory(gl.float16, [RB, BLOCK_N], sh_p)
            _fence_async_shared()  # the query's stores, before the MMAs read it (after a barrier)
        else:
            pa_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, RA], sh_p)
            if RB > 0:
                pb_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, RB], sh_p)

        bt_row = BT + b.to(gl.int64) * stride_bt
        kv_off = kvh.to(gl.int64) * stride_ch
        blk_n = _stage_prologue(KV, bt_row, kv_off, stride_cb, stride_cp, start, end, n_tiles, kw_smem, vw_smem, sz_smem,
                                PAGE, BLOCK_N, VAL_W, SZ_W, LW, STAGES, KEY_BITS, PREFETCH)

        rows_a = gl.arange(0, RA, layout=QR)
        lim_a = seq_len - K1 + 1 + rows_a // G
        m_a, l_a, r_a, c_a = _row_state(RA, QR, [BLOCK_N, RA], mma, 0)
        a0, a1, a2, a3 = _acc_zeros(D4, RA, mma)  # O^T: value head dim x rows, sub-tile e
        if RB > 0:
            rows_b = RA + gl.arange(0, RB, layout=QR_B)
            lim_b = seq_len - K1 + 1 + rows_b // G
            m_b, l_b, r_b, c_b = _row_state(RB, QR_B, [BLOCK_N, RB], mma_b, 0)
            b0, b1, b2, b3 = _acc_zeros(D4, RB, mma_b)

        for it in range(0, n_tiles):
            tile_start = start + it * BLOCK_N
            st, blk_n = _stage_tile(KV, bt_row, blk_n, kv_off, stride_cb, stride_cp, it, start, end, n_tiles, kw_smem,
                                    vw_smem, sz_smem, nr_smem, PAGE, BLOCK_N, KEY_BITS, VAL_BITS, NORM_W, VAL_W, SZ_W,
                                    LW, FOLD, STAGES, PREFETCH)
            if KEY_BITS != 8:
                kw16 = _as_halfwords(kw_smem.index(0), BLOCK_N, sh_v16)
            sa = gl.zeros([BLOCK_N, RA], gl.float32, layout=mma)  # S^T: positions x rows
            if RB > 0:
                sb = gl.zeros([BLOCK_N, RB], gl.float32, layout=mma_b)
            if KEY_BITS != 8:
                ssq = gl.zeros([BLOCK_N, 16], gl.float32, layout=opA)
                t0, t1, t2, t3, t4, t5, t6, t7 = _lut_tables(LUT, gl.full([BLOCK_N, 16], 0, gl.int32, layout=opA),
                                                            KEY_BITS, FOLD)
            for c in gl.static_range(D4 // 16):
                if KEY_BITS != 8:
                    x = kw16.slice(16 * c, 16, dim=1).load(opA)  # [BLOCK_N, 16 halfwords]
                    k0, k1, k2, k3 = _lut_wide(x, t0, t1, t2, t3, t4, t5, t6, t7, KEY_BITS, FOLD)
                    if NORM_CORRECTION:
                        sq = _sq_acc(k3, _sq_acc(k2, _sq_acc(k1, _sq_acc(k0, gl.zeros_like(k0)))))
                        ssq += sq.to(gl.float32)
                else:
                    k0, k1, k2, k3 = _fp8_wide(kw_smem.index(st).slice(16 * c, 16, dim=1).load(opA))
                sa = _mma_t(k0, qa_smem.index(0).slice(16 * c, 16, dim=1).permute([1, 0]), sa, opA, opB, WG)
                sa = _mma_t(k1, qa_smem.index(1).slice(16 * c, 16, dim=1).permute([1, 0]), sa, opA, opB, WG)
                sa = _mma_t(k2, qa_smem.index(2).slice(16 * c, 16, dim=1).permute([1, 0]), sa, opA, opB, WG)
                sa = _mma_t(k3, qa_smem.index(3).slice(16 * c, 16, dim=1).permute([1, 0]), sa, opA, opB, WG)
                if RB > 0:
                    sb = _mma_t(k0, qb_smem.index(0).slice(16 * c, 16, dim=1).permute([1, 0]), sb, opA_b, opB_b, WG)
                    sb = _mma_t(k1, qb_smem.index(1).slice(16 * c, 16, dim=1).permute([1, 0]), sb, opA_b, opB_b, WG)
                    sb = _mma_t(k2, qb_smem.index(2).slice(16 * c, 16, dim=1).permute([1, 0]), sb, opA_b, opB_b, WG)
                    sb = _mma_t(k3, qb_smem.index(3).slice(16 * c, 16, dim=1).permute([1, 0]), sb, opA_b, opB_b, WG)
                if WG:  # chunk c's MMAs read its decoded keys: at most WG_DEPTH chunks left in flight
                    if RB > 0:
                        sa, sb = _wg_wait(8 * WG_DEPTH if c < D4 // 16 - 1 else 0, deps=[sa, sb])
                    else:
                        sa = _wg_wait(4 * WG_DEPTH if c < D4 // 16 - 1 else 0, deps=[sa])
            if KEY_BITS != 8:
                k_mul = nr_smem.load(POS)
                if NORM_CORRECTION:
                    k_mul = k_mul / gl.sqrt(gl.convert_layout(gl.sum(ssq, axis=1), POS) + 1e-16)
                sa = sa * k_mul[:, None]
                if RB > 0:
                    sb = sb * gl.convert_layout(k_mul, POS_B)[:, None]
            n = tile_start + gl.arange(0, BLOCK_N, layout=POS)
            sz = sz_smem.index(st).load(POS)
            v_scale = (sz & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            v_zero = (sz >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            wa, m_a, l_a, r_a, c_a, fa = _softmax_tile(sa, (n < end)[:, None] & (n[:, None] < lim_a[None, :]), v_scale,
                                                       v_zero, m_a, l_a, r_a, c_a, HALF, 0)
            a0 = a0 * fa[None, :]
            a1 = a1 * fa[None, :]
            a2 = a2 * fa[None, :]
            a3 = a3 * fa[None, :]
            _store_weights(pa_smem, wa, WG)
            if RB > 0:
                nb = gl.convert_layout(n, POS_B)
                wb, m_b, l_b, r_b, c_b, fb = _softmax_tile(sb, (nb < end)[:, None] & (nb[:, None] < lim_b[None, :]),
                                                           gl.convert_layout(v_scale, POS_B),
                                                           gl.convert_layout(v_zero, POS_B), m_b, l_b, r_b, c_b, HALF,
                                                           0)
                b0 = b0 * fb[None, :]
                b1 = b1 * fb[None, :]
                b2 = b2 * fb[None, :]
                b3 = b3 * fb[None, :]
                _store_weights(pb_smem, wb, WG)
            if WG:  # the weight stores (both groups), before the MMAs read them (after the barrier)
                _fence_async_shared()
            _barrier()
            vh = _as_halfwords(vw_smem.index(st), BLOCK_N, sh_v16)
            for kc in gl.static_range(BLOCK_N // 16):
                h = vh.slice(16 * kc, 16, dim=0).permute([1, 0]).load(opA)  # [64 halfwords, 16 positions]
                v0, v1, v2, v3 = _nib_wide(h, VAL_BITS)
                pa = _weights_chunk(pa_smem, kc, WG)  # [16 positions, RA]
                a0 = _mma_t(v0, pa, a0, opA, opB, WG)
                a1 = _mma_t(v1, pa, a1, opA, opB, WG)
                a2 = _mma_t(v2, pa, a2, opA, opB, WG)
                a3 = _mma_t(v3, pa, a3, opA, opB, WG)
                if RB > 0:
                    pb = _weights_chunk(pb_smem, kc, WG)
                    b0 = _mma_t(v0, pb, b0, opA_b, opB_b, WG)
                    b1 = _mma_t(v1, pb, b1, opA_b, opB_b, WG)
                    b2 = _mma_t(v2, pb, b2, opA_b, opB_b, WG)
                    b3 = _mma_t(v3, pb, b3, opA_b, opB_b, WG)
                if WG:  # (the last chunk waits for all: the accumulators are rescaled next tile)
                    if RB > 0:
                        a0, a1, a2, a3, b0, b1, b2, b3 = _wg_wait(8 * WG_DEPTH if kc < BLOCK_N // 16 - 1 else 0,
                                                                  deps=[a0, a1, a2, a3, b0, b1, b2, b3])
                    else:
                        a0, a1, a2, a3 = _wg_wait(4 * WG_DEPTH if kc < BLOCK_N // 16 - 1 else 0,
                                                  deps=[a0, a1, a2, a3])
            _barrier()
        if KEY_BITS == 8:
            cp.wait_group(0)

        _store_partial(MID, a0, a1, a2, a3, m_a, l_a, r_a, c_a, rows_a, b, kvh, sid, K1, G, stride_mr, stride_mh,
                       stride_ms, POS, 0)
        if RB > 0:
            _store_partial(MID, b0, b1, b2, b3, m_b, l_b, r_b, c_b, rows_b, b, kvh, sid, K1, G, stride_mr,
                           stride_mh, stride_ms, POS_B, 0)

