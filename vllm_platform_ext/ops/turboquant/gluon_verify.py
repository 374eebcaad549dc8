"""Gluon (explicit-layout Triton) verify kernel for every TurboQuant preset at head dim 256:
``turboquant_k8v4`` on SM 8.9+ (fp8 ``cvt``), the MSE presets (``4bit_nc``, ``k3v4_nc``,
``3bit_nc``) on SM 8.0+.

Same job and output as :func:`triton_verify._tq_verify_v2` (split-KV partials in the
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

from vllm_platform_ext.ops.turboquant import ptx

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
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
        split) of them (``triton_verify.split_tiles``; the splits past the request's end are empty
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

