"""Device functions shared by the Gluon verify kernels (:mod:`.gluon_verify`): Gluon imports and
their per-version names, the inline-PTX dequant as constexprs, cp.async staging of key / value / scale
words, codebook lookups, split ranges, online softmax, partial stores and the query load in the key
decodes' order. Imports only Triton; :data:`AVAILABLE` is False where Triton has no Gluon.
"""
from __future__ import annotations

from vllm_platform_ext.ops.turboquant import ptx

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: F401 (gluon_verify)
    from triton.experimental.gluon.language.nvidia import hopper as _hopper

    _wg_wait = _hopper.warpgroup_mma_wait
    _fence_async_shared = _hopper.fence_async_shared

    # cp.async global -> shared: ``async_load`` in newer Gluon, ``async_copy_global_to_shared`` in 3.6
    _cp_async = cp.async_load if hasattr(cp, "async_load") else cp.async_copy_global_to_shared
    # CTA barrier: ``barrier`` in newer Gluon, ``thread_barrier`` in 3.6
    _barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    # shared-memory reinterpretation: ``reinterpret`` in newer Gluon, ``_reinterpret`` in 3.6
    _NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
    _FP8W = gl.constexpr(ptx.FP8W)
    _NIB4W, _NIB3W = gl.constexpr(ptx.NIB4W), gl.constexpr(ptx.NIB3W)
    _LUT8W, _LUT8SW, _LUT16W = gl.constexpr(ptx.LUT8W), gl.constexpr(ptx.LUT8SW), gl.constexpr(ptx.LUT16W)
    _SQ_ACC = gl.constexpr(ptx.SQ_ACC)
    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the Triton build
    AVAILABLE = False

if AVAILABLE:

    @gluon.jit
    def _fp8_wide(w):
        # two e4m3 key words (k-rows 2t, 2t+1) -> 4 x two fp16: bytes (0, 1), (2, 3) of each (exact; ptx.FP8W)
        return gl.inline_asm_elementwise(asm=_FP8W, constraints="=r,=r,=r,=r,r,r", args=[w],
                                         dtype=(gl.float16,) * 4, is_pure=True, pack=2)

    @gluon.jit
    def _nib_wide(h, BITS: gl.constexpr):
        # the 4 nibble positions of two int16 value words -> 4 x two fp16 ``nibble - 8`` (``- 4``
        # for 3-bit indices) (exact; ptx.NIB4W / NIB3W)
        if BITS == 4:
            return gl.inline_asm_elementwise(asm=_NIB4W, constraints="=r,=r,=r,=r,r", args=[h],
                                             dtype=(gl.float16,) * 4, is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(asm=_NIB3W, constraints="=r,=r,=r,=r,r", args=[h],
                                             dtype=(gl.float16,) * 4, is_pure=True, pack=2)

    @gluon.jit
    def _add2(a0, a1, b0, b1):
        return a0 + b0, a1 + b1

    @gluon.jit
    def _max2(a0, a1, b0, b1):
        return gl.maximum(a0, b0), gl.maximum(a1, b1)

    @gluon.jit
    def _issue(KV32, blk, kv_off32, stride_cb32, stride_cp32, tile_start, end, kw_buf, vw_buf, sz_buf,
               PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W32: gl.constexpr, SZ_W32: gl.constexpr,
               LW: gl.constexpr):
        """cp.async of one tile's key words [BLOCK_N, 64], value words [BLOCK_N, 32] and
        scale/zero word [BLOCK_N] (positions >= end read as zeros), block-table entries ``blk``
        (``_tile_blocks``). One 64-bit row address per (thread, row) serves all three copies."""
        n = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))
        ok = n < end
        row = KV32 + (blk.to(gl.int64) * stride_cb32 + kv_off32 + (n % PAGE) * stride_cp32)
        cw = gl.arange(0, 64, layout=gl.SliceLayout(0, LW))
        _cp_async(kw_buf, row[:, None] + cw[None, :], mask=ok[:, None])
        cv = gl.arange(0, 32, layout=gl.SliceLayout(0, LW))
        _cp_async(vw_buf, row[:, None] + (VAL_W32 + cv)[None, :], mask=ok[:, None])
        _cp_async(sz_buf, row + SZ_W32, mask=ok)


    @gluon.jit
    def _lut_wide(x, t0, t1, t2, t3, t4, t5, t6, t7, KEY_BITS: gl.constexpr, FOLD: gl.constexpr):
        # one staged index word (two int16 halfwords a, b) -> 4 x two fp16 centroids
        # (a0, a1), (a2, a3), (b0, b1), (b2, b3) (exact; ptx.LUT8W / LUT8SW / LUT16W)
        if KEY_BITS == 3:
            return gl.inline_asm_elementwise(asm=_LUT8W, constraints="=r,=r,=r,=r,r" + ",r" * 8,
                                             args=[x, t0, t1, t4, t5], dtype=(gl.float16,) * 4, is_pure=True,
                                             pack=2)
        elif FOLD:
            return gl.inline_asm_elementwise(asm=_LUT8SW, constraints="=r,=r,=r,=r,r" + ",r" * 8,
                                             args=[x, t0, t1, t4, t5], dtype=(gl.float16,) * 4, is_pure=True,
                                             pack=2)
        else:
            return gl.inline_asm_elementwise(asm=_LUT16W, constraints="=r,=r,=r,=r,r" + ",r" * 16,
                                             args=[x, t0, t1, t2, t3, t4, t5, t6, t7], dtype=(gl.float16,) * 4,
                                             is_pure=True, pack=2)

    @gluon.jit
    def _sq_acc(v, acc):
        return gl.inline_asm_elementwise(asm=_SQ_ACC, constraints="=r,r,r", args=[v, acc], dtype=gl.float16,
                                         is_pure=True, pack=2)

    @gluon.jit
    def _field_words(row, ok, OFF: gl.constexpr, BITS: gl.constexpr, LW: gl.constexpr, FOLD: gl.constexpr = False):
        """Words [BLOCK_N, 32] of one D=256 index field at halfword offset OFF of 2-byte-aligned
        slots (16-bit loads). 4-bit: packed nibbles as stored. 3-bit: each group of 8 indices
        (3 bytes) widened to 8 nibbles, so both widths leave element 4h+e at nibble e of halfword h."""
        w = gl.arange(0, 32, layout=gl.SliceLayout(0, LW))
        if BITS == 4:
            hw = OFF + 2 * w
        else:
            hw = OFF + (3 * w) // 2
        p = row[:, None] + hw[None, :]
        lo = gl.load(p, mask=ok[:, None], other=0).to(gl.int32) & 0xFFFF
        hi = gl.load(p + 1, mask=ok[:, None], other=0).to(gl.int32)
        x = lo | (hi << 16)
        if BITS == 3:
            x = (x >> ((w & 1) * 8)[None, :]) & 0xFFFFFF
            x = (x & 0xFFF) | ((x & 0xFFF000) << 4)
            x = (x & 0x003F003F) | ((x & 0x0FC00FC0) << 2)
            x = (x & 0x07070707) | ((x & 0x38383838) << 1)
        if FOLD:  # symmetric 4-bit codebook: index i < 8 -> 7 - i (bit 3, the sign, stays 0)
            x = x ^ ((((~x) >> 3) & 0x11111111) * 7)
        return x

    @gluon.jit
    def _tile_blocks(bt_row, tile_start, end, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, LW: gl.constexpr):
        """Block-table entries of one tile's positions (rows of the staging layout)."""
        n = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))
        return gl.load(bt_row + n // PAGE, mask=n < end, other=0)

    @gluon.jit
    def _stage_mse(KV16, blk, kv_off, stride_cb, stride_cp, tile_start, end,
                   PAGE: gl.constexpr, BLOCK_N: gl.constexpr, KEY_BITS: gl.constexpr, VAL_BITS: gl.constexpr,
                   NORM_W: gl.constexpr, VAL_W: gl.constexpr, SZ_W: gl.constexpr, LW: gl.constexpr,
                   FOLD: gl.constexpr):
        """One tile of MSE slots (block-table entries ``blk``) -> registers: key and value index
        words [BLOCK_N, 32], the key norm (fp32) and the value scale|zero word per position
        (positions >= end read as zeros)."""
        n = tile_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LW))
        ok = n < end
        row = KV16 + (blk.to(gl.int64) * stride_cb + kv_off + (n % PAGE) * stride_cp)
        kw = _field_words(row, ok, 0, KEY_BITS, LW, FOLD)
        vw = _field_words(row, ok, VAL_W, VAL_BITS, LW)
        nrm = gl.load(row + NORM_W, mask=ok, other=0).to(gl.float16, bitcast=True).to(gl.float32)
        sz = (gl.load(row + SZ_W, mask=ok, other=0).to(gl.int32) & 0xFFFF) \
            | (gl.load(row + (SZ_W + 1), mask=ok, other=0).to(gl.int32) << 16)
        return kw, vw, nrm, sz

    @gluon.jit
    def _split_range(SEQ, b, sid, NUM_SPLITS, BLOCK_N: gl.constexpr, MIN_TILES: gl.constexpr,
                     BASE_SPLITS: gl.constexpr):
        """Request b's length and split sid's positions [start, end): whole tiles per split; with
        MIN_TILES > 1 (one request: more splits) at least min(MIN_TILES, the tiles of a BASE_SPLITS
        split) of them (``launch_policy.split_tiles``; the splits past the request's end are empty
        and store log-sum-exp -inf, as everywhere)."""
        seq_len = gl.load(SEQ + b)
        if MIN_TILES > 1:
            base = gl.cdiv(gl.cdiv(seq_len, BASE_SPLITS), BLOCK_N)
            split_len = gl.maximum(gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N), gl.minimum(MIN_TILES, base)) * BLOCK_N
        else:
            split_len = gl.cdiv(gl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = sid * split_len
        end = gl.minimum(start + split_len, seq_len)
        return seq_len, start, end, gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)

    @gluon.jit
    def _stage_prologue(KV, bt_row, kv_off, stride_cb, stride_cp, start, end, n_tiles, kw_smem, vw_smem, sz_smem,
                        PAGE: gl.constexpr, BLOCK_N: gl.constexpr, VAL_W: gl.constexpr, SZ_W: gl.constexpr,
                        LW: gl.constexpr, STAGES: gl.constexpr, KEY_BITS: gl.constexpr, PREFETCH: gl.constexpr):
        """Before the tile loop: cp.async of the first STAGES - 1 tiles (k8v4), and the block-table
        entries of the next tile to stage (PREFETCH; zeros otherwise, unused)."""
        blk_n = gl.zeros([BLOCK_N], gl.int32, layout=gl.SliceLayout(1, LW))
        if KEY_BITS != 8:
            if PREFETCH:  # block-table entries of the first tile (then one tile ahead)
                blk_n = _tile_blocks(bt_row, start, end, PAGE, BLOCK_N, LW)
        else:
            for i in gl.static_range(STAGES - 1):
                if i < n_tiles:
                    _issue(KV, _tile_blocks(bt_row, start + i * BLOCK_N, end, PAGE, BLOCK_N, LW), kv_off, stride_cb,
                           stride_cp, start + i * BLOCK_N, end, kw_smem.index(i), vw_smem.index(i), sz_smem.index(i),
                           PAGE, BLOCK_N, VAL_W, SZ_W, LW)
                cp.commit_group()
            if PREFETCH:  # block-table entries of the next tile to issue (then one issue ahead)
                blk_n = _tile_blocks(bt_row, start + (STAGES - 1) * BLOCK_N, end, PAGE, BLOCK_N, LW)
        return blk_n

    @gluon.jit
    def _stage_tile(KV, bt_row, blk_n, kv_off, stride_cb, stride_cp, it, start, end, n_tiles, kw_smem, vw_smem,
                    sz_smem, nr_smem, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, KEY_BITS: gl.constexpr,
                    VAL_BITS: gl.constexpr, NORM_W: gl.constexpr, VAL_W: gl.constexpr, SZ_W: gl.constexpr,
                    LW: gl.constexpr, FOLD: gl.constexpr, STAGES: gl.constexpr, PREFETCH: gl.constexpr):
        """Tile ``it`` readable in shared memory by every warp: MSE tiles staged through registers
        into the one buffer (``nr_smem`` gets the key norms), k8v4 tiles waited for in the cp.async
        ring (and the tile STAGES - 1 ahead issued). Returns (its buffer index, the block-table
        entries read ahead)."""
        tile_start = start + it * BLOCK_N
        if KEY_BITS != 8:
            if PREFETCH:  # this tile's block-table entries were read one tile ahead
                blk_c = blk_n
                blk_n = _tile_blocks(bt_row, tile_start + BLOCK_N, end, PAGE, BLOCK_N, LW)
            else:
                blk_c = _tile_blocks(bt_row, tile_start, end, PAGE, BLOCK_N, LW)
            kw_c, vw_c, nr_c, sz_c = _stage_mse(KV, blk_c, kv_off, stride_cb, stride_cp, tile_start, end, PAGE,
                                                BLOCK_N, KEY_BITS, VAL_BITS, NORM_W, VAL_W, SZ_W, LW, FOLD)
            kw_smem.index(0).store(kw_c)
            vw_smem.index(0).store(vw_c)
            nr_smem.store(nr_c)
            sz_smem.index(0).store(sz_c)
            _barrier()
            st = 0
        else:
            nxt = it + STAGES - 1
            if nxt < n_tiles:
                if PREFETCH:  # entries read one issue ahead; read the following tile's now
                    blk_c = blk_n
                    blk_n = _tile_blocks(bt_row, start + (nxt + 1) * BLOCK_N, end, PAGE, BLOCK_N, LW)
                else:
                    blk_c = _tile_blocks(bt_row, start + nxt * BLOCK_N, end, PAGE, BLOCK_N, LW)
                _issue(KV, blk_c, kv_off, stride_cb, stride_cp, start + nxt * BLOCK_N, end,
                       kw_smem.index(nxt % STAGES), vw_smem.index(nxt % STAGES), sz_smem.index(nxt % STAGES),
                       PAGE, BLOCK_N, VAL_W, SZ_W, LW)
            cp.commit_group()
            cp.wait_group(STAGES - 1)
            _barrier()
            st = it % STAGES
        return st, blk_n

    @gluon.jit
    def _lut_tables(LUT, zb, KEY_BITS: gl.constexpr, FOLD: gl.constexpr):
        """The codebook byte tables (LUT: low bytes then high bytes, 4 entries per word) as splat
        operands of the lookups, shaped like ``zb`` (zeros in the index operand's layout; 8-entry
        codebooks use t0, t1, t4, t5)."""
        NT: gl.constexpr = 2 ** KEY_BITS // 4 if not FOLD else 2
        return (zb + gl.load(LUT), zb + gl.load(LUT + 1), zb + gl.load(LUT + (2 % (2 * NT))),
                zb + gl.load(LUT + (3 % (2 * NT))), zb + gl.load(LUT + NT), zb + gl.load(LUT + NT + 1),
                zb + gl.load(LUT + (NT + 2) % (2 * NT)), zb + gl.load(LUT + (NT + 3) % (2 * NT)))

    @gluon.jit
    def _as_halfwords(buf, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """A [BLOCK_N, 32] int32 word buffer seen as [BLOCK_N, 64] halfwords (the ldmatrix reads)."""
        if _NEW_REINTERPRET:
            return buf.reinterpret(gl.int16, [BLOCK_N, 64], layout)
        else:
            return buf._reinterpret(gl.int16, [BLOCK_N, 64], layout)

    @gluon.jit
    def _fold_positions(x, POS_AXIS: gl.constexpr):
        """x [M, N] (an MMA accumulator layout, positions along POS_AXIS) summed over the position
        bits that stay in one thread's registers, so a per-element running sum needs fewer registers
        (any other split would only cost shuffles; the sum is the same): row-major S (positions
        along N, mma.sync 16 x 8 tiles): the column pair of a register pair and the tile's upper
        half of positions; transposed S^T (positions along M): rows g and g + 8 of each 16-row tile."""
        M: gl.constexpr = x.shape[0]
        N: gl.constexpr = x.shape[1]
        if POS_AXIS == 1:
            y = gl.sum(gl.reshape(x, [M, N // 2, 2]), axis=2)
            y = gl.sum(gl.reshape(y, [M, 2, N // 4]), axis=1)
        else:
            y = gl.reshape(gl.sum(gl.reshape(x, [M // 16, 2, 8, N]), axis=1), [M // 2, N])
        return y

    @gluon.jit
    def _row_state(R: gl.constexpr, L: gl.constexpr, SUM_SHAPE: gl.constexpr, SUM_L: gl.constexpr,
                   POS_AXIS: gl.constexpr):
        """Online-softmax state of R rows (layout L): running max, sum, zero-point sum, value scale.
        The two sums are kept per score element of a tile (shape SUM_SHAPE, layout SUM_L, positions
        along POS_AXIS, folded by ``_fold_positions``) and reduced over the positions once, when
        the partial is stored: no cross-warp reduction for them per tile."""
        l0 = _fold_positions(gl.zeros(SUM_SHAPE, gl.float32, layout=SUM_L), POS_AXIS)
        r0 = _fold_positions(gl.zeros(SUM_SHAPE, gl.float32, layout=SUM_L), POS_AXIS)
        return gl.full([R], float("-inf"), gl.float32, layout=L), l0, r0, gl.full([R], 1.0, gl.float32, layout=L)

    @gluon.jit
    def _acc_zeros(M: gl.constexpr, N: gl.constexpr, L: gl.constexpr):
        """The four output sub-tile accumulators [M, N] (layout L), zero."""
        return (gl.zeros([M, N], gl.float32, layout=L), gl.zeros([M, N], gl.float32, layout=L),
                gl.zeros([M, N], gl.float32, layout=L), gl.zeros([M, N], gl.float32, layout=L))

    @gluon.jit
    def _softmax_tile(s, visible, v_scale, v_zero, m_i, l_i, r_i, c_i, HALF: gl.constexpr, POS_AXIS: gl.constexpr):
        """Online softmax of one tile's scores (positions along POS_AXIS: 1 for the row-major kernel's
        S, 0 for the transposed kernel's S^T) -> fp16 weights (times the value scale over the tile's
        largest), the updated row state and the accumulators' rescale factor per row."""
        s = gl.where(visible, s, float("-inf"))
        # one cross-warp reduction for both maxima: the rows' scores and the tile's value scale
        # (the latter comes out per row, all equal)
        s_row, v_row = gl.reduce((s, gl.zeros_like(s) + gl.expand_dims(v_scale, 1 - POS_AXIS)), POS_AXIS, _max2)
        m_new = gl.maximum(m_i, s_row)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - gl.expand_dims(m_use, POS_AXIS))
        s_max = gl.maximum(gl.max(v_row, axis=0), 6e-8)  # (the rows are within each warp)
        w16 = (p * gl.expand_dims(v_scale / s_max, 1 - POS_AXIS)).to(gl.float16)
        # the row sums per (folded) score element: sum p, and the zero points + centring offset (HALF
        # per index); _store_partial reduces them over the positions
        pf = _fold_positions(p, POS_AXIS)
        a2 = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(POS_AXIS, pf.type.layout)), POS_AXIS)
        l_new = l_i * a2 + pf
        r_new = r_i * a2 + _fold_positions(p * gl.expand_dims(v_zero, 1 - POS_AXIS)
                                           + (HALF * s_max) * w16.to(gl.float32), POS_AXIS)
        f = alpha * (c_i / s_max)
        return w16, m_new, l_new, r_new, gl.full_like(c_i, 1.0) * s_max, f

    @gluon.jit
    def _store_partial(MID, acc0, acc1, acc2, acc3, m_i, l_i, r_i, c_i, rows, b, kvh, sid, K1, G: gl.constexpr,
                       stride_mr, stride_mh, stride_ms, JL: gl.constexpr, POS_AXIS: gl.constexpr):
        """One program's (or row group's) split-KV partial: sub-tiles e of the output (head dim along
        POS_AXIS, index layout JL) at columns e*64 + j, and the rows' log2-sum-exp (the row sums,
        kept per score element, reduced over the positions here)."""
        l_i, r_i = gl.reduce((l_i, r_i), POS_AXIS, _add2)
        l_i = gl.convert_layout(l_i, m_i.type.layout)
        r_i = gl.convert_layout(r_i, m_i.type.layout)
        has = l_i > 0.0
        inv = 1.0 / gl.where(has, l_i, 1.0)
        ci = gl.expand_dims(c_i * inv, POS_AXIS)
        ri = gl.expand_dims(r_i * inv, POS_AXIS)
        lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        okr = rows < K1 * G
        mid = MID + (b * K1 + rows // G).to(gl.int64) * stride_mr + (kvh * G + rows % G).to(gl.int64) * stride_mh \
            + sid * stride_ms
        j = gl.arange(0, 64, layout=JL)
        mp = gl.expand_dims(mid, POS_AXIS) + gl.expand_dims(j, 1 - POS_AXIS)
        ok = gl.expand_dims(okr, POS_AXIS)
        gl.store(mp, acc0 * ci + ri, mask=ok)
        gl.store(mp + 64, acc1 * ci + ri, mask=ok)
        gl.store(mp + 128, acc2 * ci + ri, mask=ok)
        gl.store(mp + 192, acc3 * ci + ri, mask=ok)
        gl.store(mid + 256, lse2, mask=okr)

    @gluon.jit
    def _load_query(Q, q_smem, r0, R: gl.constexpr, b, kvh, K1, G: gl.constexpr, stride_qn, stride_qh, qk_scale,
                    LQ: gl.constexpr):
        """Query rows r0 .. r0+R-1 of (request b, KV head kvh) (zero past K1 * G; any float dtype),
        times qk_scale (softmax scale * log2 e), as fp16 -> shared memory, four sub-tiles [R, 64] with
        the head dim in the key decodes' order: column j of sub-tile e holds element
        8 (j // 2) + 2 e + j % 2 (``triton_verify.gluon_query_order`` on the host is the same order)."""
        mq = r0 + gl.arange(0, R, layout=gl.SliceLayout(1, LQ))
        okq = mq < K1 * G
        qrow = (b * K1 + mq // G).to(gl.int64) * stride_qn + (kvh * G + mq % G).to(gl.int64) * stride_qh
        j = gl.arange(0, 64, layout=gl.SliceLayout(0, LQ))
        src = (j // 2) * 8 + j % 2
        for e in gl.static_range(4):
            qv = gl.load(Q + (qrow[:, None] + (src + 2 * e)[None, :]), mask=okq[:, None], other=0.0)
            q_smem.index(e).store((qv.to(gl.float32) * qk_scale).to(gl.float16))
