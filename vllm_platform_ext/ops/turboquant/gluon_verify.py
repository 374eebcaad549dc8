"""Gluon (explicit-layout Triton) verify kernel for ``turboquant_k8v4``, SM 8.9+ (fp8 ``cvt``).

Same job and output as :func:`triton_verify._tq_verify_v2` (split-KV partials in the
workspace, combined by ``_tq_verify_stage2`` with ``SPLIT4``), but every layout is chosen here:

* raw key words (4 fp8 bytes) and value words (2 x 4 nibbles) go global -> shared memory with
  ``cp.async`` (STAGES-deep ring) and come out of shared memory straight in the MMA operand
  layout, where they are converted in registers (no dequantized tile is written anywhere);
* the fp16 query (scaled, sub-tile e = head dim elements 4j+e) sits in shared memory once and
  is read per 16-wide chunk, so no warp holds the whole query in registers;
* softmax weights go through a small shared tile to the second product;
* warps split both the rows and the tile's positions (``WM x WN``).

Imports only torch and Triton; :data:`AVAILABLE` is False where Triton has no Gluon.
"""
from __future__ import annotations

from vllm_platform_ext.ops.turboquant import ptx

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    # cp.async global -> shared: ``async_load`` in newer Gluon, ``async_copy_global_to_shared`` in 3.6
    _cp_async = cp.async_load if hasattr(cp, "async_load") else cp.async_copy_global_to_shared
    # CTA barrier: ``barrier`` in newer Gluon, ``thread_barrier`` in 3.6
    _barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    # shared-memory reinterpretation: ``reinterpret`` in newer Gluon, ``_reinterpret`` in 3.6
    _NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
    _FP8_POS_0, _FP8_POS_1 = gl.constexpr(ptx.FP8_POS[0]), gl.constexpr(ptx.FP8_POS[1])
    _NIB_POS_0, _NIB_POS_1 = gl.constexpr(ptx.NIB_POS[0]), gl.constexpr(ptx.NIB_POS[1])
    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the Triton build
    AVAILABLE = False

if AVAILABLE:

    @gluon.jit
    def _fp8_pos(w, SEL: gl.constexpr):
        # byte position SEL of two e4m3 key words -> two fp16 (exact; ptx.FP8_POS)
        return gl.inline_asm_elementwise(asm=_FP8_POS_0 + SEL + _FP8_POS_1, constraints="=r,r,r", args=[w],
                                         dtype=gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def _nib_pos(h, SHIFT: gl.constexpr):
        # nibble position SHIFT of two int16 value words -> two fp16 ``nibble - 8`` (exact; ptx.NIB_POS)
        return gl.inline_asm_elementwise(asm=_NIB_POS_0 + SHIFT + _NIB_POS_1, constraints="=r,r", args=[h],
                                         dtype=gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def _add2(a0, a1, b0, b1):
        return a0 + b0, a1 + b1

    @gluon.jit
    def _issue(KV32, bt_row, kv_off32, stride_cb32, stride_cp32, tile_start, end, kw_buf, vw_buf, sz_buf,
               PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W32: gl.constexpr, SZ_W32: gl.constexpr,
               LW: gl.constexpr):
        """cp.async of one tile's key words [BLOCK_N, 64], value words [BLOCK_N, 32] and
        scale/zero word [BLOCK_N] (positions >= end read as zeros). One block-table read and one
        64-bit row address per (thread, row) serve all three copies."""
        n = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))
        ok = n < end
        blk = gl.load(bt_row + n // PAGE, mask=ok, other=0).to(gl.int64)
        row = KV32 + (blk * stride_cb32 + kv_off32 + (n % PAGE) * stride_cp32)
        cw = gl.arange(0, 64, layout=gl.SliceLayout(0, LW))
        _cp_async(kw_buf, row[:, None] + cw[None, :], mask=ok[:, None])
        cv = gl.arange(0, 32, layout=gl.SliceLayout(0, LW))
        _cp_async(vw_buf, row[:, None] + (VAL_W32 + cv)[None, :], mask=ok[:, None])
        _cp_async(sz_buf, row + SZ_W32, mask=ok)


    @gluon.jit
    def _tq_verify_gluon_k8v4(
        Q16, KV32, BT, SEQ, MID,
        stride_qn, stride_qh,
        stride_cb32, stride_cp32, stride_ch32,  # in 32-bit words
        stride_bt,
        stride_mr, stride_mh, stride_ms,
        K1, NUM_SPLITS,
        G: gl.constexpr, BLOCK_M: gl.constexpr, M_CHUNKS: gl.constexpr,
        PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W32: gl.constexpr, SZ_W32: gl.constexpr,
        WM: gl.constexpr, WN: gl.constexpr, STAGES: gl.constexpr,
    ):
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
        # key rows of 64 words in 8-word units; value rows (32 words = 64 halfwords) in 16-byte
        # units, seen as int32 by cp.async and as int16 by the transposing ldmatrix reads
        sh_w: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_v32: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        sh_v16: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        sh_s: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sh_h: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])

        b = gl.program_id(1)
        kvh = gl.program_id(0) // M_CHUNKS
        mc = gl.program_id(0) % M_CHUNKS
        sid = gl.program_id(2)
        seq_len = gl.load(SEQ + b)
        split_len = gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = sid * split_len
        end = gl.minimum(start + split_len, seq_len)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

        # query -> shared memory, four sub-tiles [BLOCK_M, 64]
        q_smem = gl.allocate_shared_memory(gl.float16, [4, BLOCK_M, D4], sh_h)
        mq = mc * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LQ))
        okq = mq < K1 * G
        qrow = (b * K1 + mq // G).to(gl.int64) * stride_qn + (kvh * G + mq % G).to(gl.int64) * stride_qh
        jq = gl.arange(0, D4, layout=gl.SliceLayout(0, LQ))
        for e in gl.static_range(4):
            qv = gl.load(Q16 + (qrow[:, None] + e * D4 + jq[None, :]), mask=okq[:, None], other=0.0)
            q_smem.index(e).store(qv)

        kw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4], sh_w)
        vw_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, D4 // 2], sh_v32)
        sz_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], sh_s)
        p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, BLOCK_N], sh_h)

        bt_row = BT + b.to(gl.int64) * stride_bt
        kv_off32 = kvh.to(gl.int64) * stride_ch32
        for i in gl.static_range(STAGES - 1):
            if i < n_tiles:
                _issue(KV32, bt_row, kv_off32, stride_cb32, stride_cp32, start + i * BLOCK_N, end,
                       kw_smem.index(i), vw_smem.index(i), sz_smem.index(i), PAGE, BLOCK_N, VAL_W32, SZ_W32,
                       LW)
            cp.commit_group()

        rows = mc * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW)
        lim = seq_len - K1 + 1 + rows // G
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=ROW)
        r_i = gl.zeros([BLOCK_M], gl.float32, layout=ROW)
        c_i = gl.full([BLOCK_M], 1.0, gl.float32, layout=ROW)
        acc0 = gl.zeros([BLOCK_M, D4], gl.float32, layout=mma)
        acc1 = gl.zeros([BLOCK_M, D4], gl.float32, layout=mma)
        acc2 = gl.zeros([BLOCK_M, D4], gl.float32, layout=mma)
        acc3 = gl.zeros([BLOCK_M, D4], gl.float32, layout=mma)

        for it in range(0, n_tiles):
            nxt = it + STAGES - 1
            if nxt < n_tiles:
                _issue(KV32, bt_row, kv_off32, stride_cb32, stride_cp32, start + nxt * BLOCK_N, end,
                       kw_smem.index(nxt % STAGES), vw_smem.index(nxt % STAGES), sz_smem.index(nxt % STAGES),
                       PAGE, BLOCK_N, VAL_W32, SZ_W32, LW)
            cp.commit_group()
            cp.wait_group(STAGES - 1)
            _barrier()
            st = it % STAGES
            kwt = kw_smem.index(st).permute([1, 0])  # [64 words, BLOCK_N]
            s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
            for c in gl.static_range(D4 // 16):
                w = kwt.slice(16 * c, 16, dim=0).load(opB)
                s = mma_v2(q_smem.index(0).slice(16 * c, 16, dim=1).load(opA), _fp8_pos(w, "0x40"), s)
                s = mma_v2(q_smem.index(1).slice(16 * c, 16, dim=1).load(opA), _fp8_pos(w, "0x51"), s)
                s = mma_v2(q_smem.index(2).slice(16 * c, 16, dim=1).load(opA), _fp8_pos(w, "0x62"), s)
                s = mma_v2(q_smem.index(3).slice(16 * c, 16, dim=1).load(opA), _fp8_pos(w, "0x73"), s)
            n = start + it * BLOCK_N + gl.arange(0, BLOCK_N, layout=COL)
            visible = (n < end)[None, :] & (n[None, :] < lim[:, None])
            s = gl.where(visible, s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])

            sz = sz_smem.index(st).load(COL)
            v_scale = (sz & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            v_zero = (sz >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            s_max = gl.maximum(gl.max(v_scale, axis=0), 6e-8)
            w16 = (p * (v_scale / s_max)[None, :]).to(gl.float16)
            # one reduction for both row sums: sum p, and the zero points + centring offset (8 per index)
            lsum, rsum = gl.reduce((p, p * v_zero[None, :] + (8.0 * s_max) * w16.to(gl.float32)), 1, _add2)
            l_i = l_i * alpha + lsum
            r_i = r_i * alpha + rsum
            f = (alpha * (c_i / s_max))[:, None]
            c_i = gl.full([BLOCK_M], 1.0, gl.float32, layout=ROW) * s_max
            acc0 = acc0 * f
            acc1 = acc1 * f
            acc2 = acc2 * f
            acc3 = acc3 * f
            p_smem.store(w16)
            _barrier()
            if _NEW_REINTERPRET:
                vh = vw_smem.index(st).reinterpret(gl.int16, [BLOCK_N, D4], sh_v16)
            else:
                vh = vw_smem.index(st)._reinterpret(gl.int16, [BLOCK_N, D4], sh_v16)
            for kc in gl.static_range(BLOCK_N // 16):
                pa = p_smem.slice(16 * kc, 16, dim=1).load(opA)
                h = vh.slice(16 * kc, 16, dim=0).load(opB)
                acc0 = mma_v2(pa, _nib_pos(h, "0"), acc0)
                acc1 = mma_v2(pa, _nib_pos(h, "4"), acc1)
                acc2 = mma_v2(pa, _nib_pos(h, "8"), acc2)
                acc3 = mma_v2(pa, _nib_pos(h, "12"), acc3)
            m_i = m_new
            _barrier()
        cp.wait_group(0)

        has = l_i > 0.0
        inv = 1.0 / gl.where(has, l_i, 1.0)
        ci = c_i * inv
        ri = r_i * inv
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        okr = rows < K1 * G
        mid = MID + (b * K1 + rows // G).to(gl.int64) * stride_mr + (kvh * G + rows % G).to(gl.int64) * stride_mh \
            + sid * stride_ms
        j = gl.arange(0, D4, layout=COL)
        mp = mid[:, None] + j[None, :]
        gl.store(mp, acc0 * ci[:, None] + ri[:, None], mask=okr[:, None])
        gl.store(mp + D4, acc1 * ci[:, None] + ri[:, None], mask=okr[:, None])
        gl.store(mp + 2 * D4, acc2 * ci[:, None] + ri[:, None], mask=okr[:, None])
        gl.store(mp + 3 * D4, acc3 * ci[:, None] + ri[:, None], mask=okr[:, None])
        gl.store(mid + D, lse2, mask=okr)
