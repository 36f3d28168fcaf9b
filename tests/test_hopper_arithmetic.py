"""The Hopper (Gluon) kernels' arithmetic on the CPU, against the fp64 oracle and plain enumerations.

Gluon has no interpreter, but the kernels' pure-arithmetic helpers are plain Python under @gluon.jit: their `.fn`
runs on torch tensors once the module's `gl` is a small stand-in mapping gl.exp2, gl.max, gl.where, gl.sum, … onto
torch, and the helpers they call are their own `.fn` too. What stays on the GPU: the matmuls, the TMA copies, the
barriers and the warp specialisation (`attnlab check` runs the kernels themselves against the oracle there). Here the
tests walk a kernel's tiles as its loop does (each key tile's scores from q·kᵀ, in float32) and hand each tile to the
kernel's own helpers: the score tile with its masks, the online softmax, pass 1 against a running max or a fixed
reference, P from the row's bias, the one-pass kernel's per-tile exponentials and merge, the no_pv step, and the
work-item order of a persistent program.
"""
import math
import types

import pytest
import torch

from attnlab import reference
from attnlab.triton.config import LOG2E
from attnlab.triton.hopper import common, qk_softmax_row
from attnlab.triton.hopper import fused as fused_gluon
from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

MODULES = (common, fused_gluon, qk_softmax_gluon, qk_softmax_row)


def _tensor(x):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x)


def gl_on_torch(memory=None):
    """The part of gluon.language the helpers use, on torch tensors. gl.load and gl.store read and write `memory`
    (a flat tensor), pointers being int64 indices into it."""
    def load(ptrs, mask=None, other=0):
        got = memory[ptrs.clamp(0, memory.numel() - 1)]
        return got if mask is None else torch.where(mask, got, torch.as_tensor(other, dtype=got.dtype))

    def store(ptrs, values, mask=None):
        keep = torch.ones_like(ptrs, dtype=torch.bool) if mask is None else mask
        memory[ptrs[keep]] = values[keep].to(memory.dtype)

    return types.SimpleNamespace(
        float32=torch.float32, int64=torch.int64, int8=torch.int8, constexpr=int,
        exp2=torch.exp2, log2=torch.log2, cdiv=lambda a, b: -(-a // b),
        maximum=lambda a, b: torch.maximum(_tensor(a), _tensor(b)),
        minimum=lambda a, b: torch.minimum(_tensor(a), _tensor(b)),
        max=lambda x, axis: x.amax(dim=axis), sum=lambda x, axis: x.sum(dim=axis),
        where=lambda c, a, b: torch.where(c, _tensor(a), _tensor(b)), load=load, store=store)


@pytest.fixture
def gluon_on_cpu(monkeypatch):
    """Every @gluon.jit function of the Hopper modules replaced by its Python body, and their `gl` by gl_on_torch;
    the fixture's value sets the memory gl.load and gl.store reach."""
    for module in MODULES:
        for name, value in list(vars(module).items()):
            if hasattr(value, "fn") and callable(getattr(value, "fn")) and hasattr(value, "arg_names"):
                monkeypatch.setattr(module, name, value.fn)

    def with_memory(memory=None):
        for module in MODULES:
            monkeypatch.setattr(module, "gl", gl_on_torch(memory))

    with_memory()
    return with_memory


# -- the work-item order --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,BLOCK_M,BLOCK_N,ROWS", [(300, 16, 32, 2), (256, 64, 128, 2), (200, 64, 64, 1),
                                                    (1, 64, 128, 2), (129, 32, 32, 2)])
@pytest.mark.parametrize("causal,heavy_first,persistent", [(False, False, False), (True, False, False),
                                                           (True, True, False), (False, False, True),
                                                           (True, True, True)])
def test_every_row_block_of_every_head_is_one_programs_work_exactly_once(gluon_on_cpu, N, BLOCK_M, BLOCK_N, ROWS,
                                                                          causal, heavy_first, persistent):
    """items, item_at, step_item and program as the kernels run them, over every program of the grid (persistent:
    fewer programs than items, and more): each (batch, head, row block) exactly once, its k/v head the query head's
    group, its key tiles every tile up to N (under a causal mask up to its last row, no further)."""
    B, H, GROUP = 2, 4, 2
    rows = ROWS * BLOCK_M
    n_blocks = -(-N // rows)
    total = B * H * n_blocks
    for nprog in ((total,) if not persistent else (1, 3, total, total + 5)):
        seen = []
        for pid in range(min(nprog, total) if persistent else total):
            if persistent:
                start, end, step = common.items(pid, nprog, total, causal and heavy_first)
                steps = range(start, end, step)
            else:
                steps = [pid]
            for x in steps:
                work = (pid, nprog, total)
                b, h, hk, start_m, n_tiles, m_head = common.step_item(
                    torch.tensor(x), work, 0, 1000, 10, N, H, GROUP, BLOCK_M, BLOCK_N, causal, heavy_first, ROWS,
                    persistent)
                b, h, hk, start_m, n_tiles = (int(v) for v in (b, h, hk, start_m, n_tiles))
                assert hk == h // GROUP and int(m_head) == b * 1000 + h * 10
                hi = min(N, start_m + rows) if causal else N
                assert (n_tiles - 1) * BLOCK_N < hi <= n_tiles * BLOCK_N
                seen.append((b, h, start_m))
        assert sorted(seen) == sorted((b, h, r * rows) for b in range(B) for h in range(H) for r in range(n_blocks))


@pytest.mark.parametrize("n_blocks", [2, 4, 6, 16])
def test_a_persistent_causal_program_takes_its_items_in_heavy_light_pairs_of_equal_weight(gluon_on_cpu, n_blocks):
    """Under a causal mask with heavy_first, a persistent program's items come in pairs of consecutive items of one
    head (heaviest with lightest, …): with key tiles as tall as a program's rows, each pair holds n_blocks + 1 key
    tiles, so every program's load is its number of pairs times that, whatever the grid."""
    BLOCK_M, ROWS = 32, 2
    N, H = n_blocks * BLOCK_M * ROWS, 3
    total = H * n_blocks
    for nprog in (1, 2, 5, total // 2):
        for pid in range(nprog):
            start, end, step = common.items(pid, nprog, total, True)
            loads = [common.step_item(torch.tensor(x), (pid, nprog, total), 0, 0, 0, N, H, 1, BLOCK_M,
                                      BLOCK_M * ROWS, True, True, ROWS, True) for x in range(start, end, step)]
            for first, second in zip(loads[::2], loads[1::2]):
                assert int(first[1]) == int(second[1])  # one head
                assert int(first[4]) + int(second[4]) == n_blocks + 1
            assert not loads or int(loads[0][4]) >= int(loads[-1][4])  # heavy first


# -- the score tile and the online softmax (fused; pass 1 of the P kernel) -----------------------------------------

def _case(N, D, mask_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, N, D, generator=g) for _ in range(3))
    if mask_kind == 1:
        mask = torch.rand(N, N, generator=g) > 0.3
        mask[3] = False  # a row hidden entirely: O = 0 and P = 0, never NaN
        mask[5, : N // 2] = False  # a row whose first key tiles are all hidden
    elif mask_kind == 2:
        mask = torch.randn(N, N, generator=g) * 3
    else:
        mask = None
    return q, k, v, mask


def _memory(mask, N, extra=0):
    """The mask as the kernel reads it, row-major (N, N), broadcast over batch and heads (strides 0, 0, N, 1), in
    float32 (a boolean mask as 0 and 1), then `extra` more elements (the flags the P kernel writes)."""
    flat = torch.zeros(N * N) if mask is None else mask.flatten().to(torch.float32)
    return torch.cat([flat, torch.zeros(extra)])


def _score_tile(q, k, rows, j, BLOCK_M, BLOCK_N):
    """Raw q·kᵀ of the row block from `rows` and key tile j, zeros past N (TMA's fill), in float32."""
    N = q.shape[2]
    qb = torch.zeros(BLOCK_M, q.shape[3])
    kb = torch.zeros(BLOCK_N, k.shape[3])
    qb[: max(0, min(N, rows + BLOCK_M) - rows)] = q[0, 0, rows: rows + BLOCK_M]
    kb[: max(0, min(N, (j + 1) * BLOCK_N) - j * BLOCK_N)] = k[0, 0, j * BLOCK_N: (j + 1) * BLOCK_N]
    return qb @ kb.T


def _rows_of(N, causal, BLOCK_M, BLOCK_N, ROWS=2):
    """(rows, hi, n_tiles) of each consumer's row block, as program() and the kernels' item loops give them."""
    out = []
    for start_m in range(0, N, ROWS * BLOCK_M):
        n_tiles = -(-(min(N, start_m + ROWS * BLOCK_M) if causal else N) // BLOCK_N)
        for wg in range(ROWS):
            rows = start_m + wg * BLOCK_M
            out.append((rows, min(N, rows + BLOCK_M) if causal else N, n_tiles))
    return out


@pytest.mark.parametrize("mask_kind", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ablation", [None, "no_softmax", "no_pv"])
def test_the_fused_kernels_tile_loop_matches_the_oracle(gluon_on_cpu, mask_kind, causal, ablation):
    """The fused kernel's consumer loop over key tiles (softmax_tile: scores with their masks, online softmax; O
    rescaled by α and P·V added, or _no_pv_step; O / l at the end, a row with no key left 0): O equals the fp64
    oracle of the program it runs (attention, or its no_softmax / no_pv ablation), N ragged against both tile
    sizes, with a row hidden entirely and one whose first tiles are hidden."""
    N, D, BLOCK_M, BLOCK_N = 77, 16, 16, 32
    q, k, v, mask = _case(N, D, mask_kind)
    gluon_on_cpu(_memory(mask, N))
    no_softmax, no_pv = ablation == "no_softmax", ablation == "no_pv"
    log_scale = 1.0 if no_softmax else LOG2E  # as the launcher passes them: softmax in exp2 units, the copy S itself
    qk_scale = D ** -0.5 * log_scale
    out = torch.zeros(N, D)
    vpad = torch.zeros(-(-N // BLOCK_N) * BLOCK_N, D)
    vpad[:N] = v[0, 0]
    for rows, hi, n_tiles in _rows_of(N, causal, BLOCK_M, BLOCK_N):
        offs_m = rows + torch.arange(BLOCK_M)
        cols = torch.arange(BLOCK_N)
        m_i, l_i = torch.full((BLOCK_M,), -math.inf), torch.zeros(BLOCK_M)
        acc = torch.zeros(BLOCK_M, BLOCK_N if no_pv else D)
        for j in range(n_tiles):
            s = _score_tile(q, k, rows, j, BLOCK_M, BLOCK_N)
            p, m_i, l_i, alpha, offs_n = common.softmax_tile(
                s, m_i, l_i, j, rows, hi, offs_m.to(torch.int64) * N, None, offs_m, cols, N, 1, qk_scale, log_scale,
                BLOCK_N, causal, mask_kind, no_softmax, False)
            if no_pv:
                acc = fused_gluon._no_pv_step(acc, p, offs_n, 1.0 / N, alpha, no_softmax)
            else:
                acc = (acc if no_softmax else acc * alpha[:, None]) + p @ vpad[j * BLOCK_N: (j + 1) * BLOCK_N]
        o = acc.sum(dim=1, keepdim=True).expand(BLOCK_M, D) if no_pv else acc
        if not no_softmax:
            o = o / torch.where(l_i == 0.0, 1.0, l_i)[:, None]
        keep = min(BLOCK_M, N - rows)
        if keep > 0:
            out[rows: rows + keep] = o[:keep]
    want = reference.attend(q, k, v, causal=causal, attn_mask=mask, ablation=ablation)[0, 0]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    if mask_kind == 1 and ablation is None:
        assert torch.equal(out[3], torch.zeros(D))


# -- the two-pass P kernel ----------------------------------------------------------------------------------------

def _p_kernel(with_memory, q, k, mask, causal, no_softmax, ref1, BLOCK_M=16, BLOCK_N=32):
    """P and the rows' flags as the two-pass P kernel's consumers make them: pass 1 (_step: softmax_tile's running
    max and sum, or REF1 _ref_tile's sum against a fixed reference, then _flag_rows), the bias (p_bias), pass 2
    (_step writing _p_tile's P), and zeros past a causal row block's last key tile."""
    N = q.shape[2]
    written = torch.full((N, N), math.nan)
    memory = _memory(mask, N, extra=N)  # the mask, then the rows' flags at N·N
    with_memory(memory)
    mask_kind = 0 if mask is None else (1 if mask.dtype == torch.bool else 2)

    def store_p(p, j, p_desc, p_smem, slot0, pbase, b, h, rows, BN):
        r, c = slice(rows, min(N, rows + p.shape[0])), slice(j * BN, min(N, (j + 1) * BN))
        if r.stop > r.start:  # TMA drops what lies past N
            written[r, c] = p[: r.stop - r.start, : c.stop - c.start]

    qk_softmax_gluon._store_p = store_p  # the gluon_on_cpu fixture's monkeypatch restores the module's
    qk_softmax_gluon._release = lambda *a: None  # the K ring's barrier
    log_scale = 1.0 if no_softmax else LOG2E  # as the launcher passes them
    for rows, hi, n_tiles in _rows_of(N, causal, BLOCK_M, BLOCK_N):
        offs_m, cols = rows + torch.arange(BLOCK_M), torch.arange(BLOCK_N)
        masks = (offs_m.to(torch.int64) * N, None, None)
        m_i, l_i = torch.full((BLOCK_M,), -math.inf), torch.zeros(BLOCK_M)
        args = lambda j: (_score_tile(q, k, rows, j, BLOCK_M, BLOCK_N), j, j)  # noqa: E731
        rest = (0, 0, 0, 0, rows, hi, masks, offs_m, cols, N, 1, q.shape[3] ** -0.5 * log_scale, log_scale)
        if not no_softmax:
            for j in range(n_tiles):
                m_i, l_i = qk_softmax_gluon._step(*args(j), m_i, l_i, m_i, None, None, *rest, False, BLOCK_N, 2,
                                                  causal, mask_kind, no_softmax, False, 0, 2, ref1)
            if ref1:
                keep = offs_m < N
                good = (l_i > 0.0) & (l_i < math.inf)
                qk_softmax_gluon._flag_rows(l_i, offs_m, N * N, 0, N)
                assert torch.equal(memory[N * N + offs_m[keep]], (~good[keep]).to(torch.float32))
        bias = common.p_bias(m_i, l_i)
        for j in range(n_tiles):
            qk_softmax_gluon._step(*args(j), m_i, l_i, bias, None, None, *rest, True, BLOCK_N, 2, causal, mask_kind,
                                   no_softmax, False, 0, 2, False)
        written[rows: rows + BLOCK_M, n_tiles * BLOCK_N:] = 0.0  # the zero tiles past the diagonal
    return written, memory[N * N:].to(torch.int8)


@pytest.mark.parametrize("mask_kind", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pass1", ["running_max", "fixed_reference", "no_softmax"])
def test_the_p_kernels_two_passes_match_the_oracle(gluon_on_cpu, mask_kind, causal, pass1):
    """The two-pass P kernel's arithmetic: every element of P written, equal to the fp64 oracle's softmax(S) (under
    no_softmax: S with masked entries 0), a hidden row all zeros; against a fixed reference (REF1) the rows it flags
    are exactly those whose sum is not a positive finite number, and every row it does not flag is right."""
    N, D = 77, 16
    q, k, _, mask = _case(N, D, mask_kind, seed=1)
    p, flags = _p_kernel(gluon_on_cpu, q, k, mask, causal, pass1 == "no_softmax", pass1 == "fixed_reference")
    s = reference.scores(q, k, causal=causal, attn_mask=mask)[0, 0]
    want = torch.where(torch.isinf(s), 0.0, s) if pass1 == "no_softmax" else reference.softmax(s)
    assert not torch.isnan(p[flags == 0]).any()
    torch.testing.assert_close(p[flags == 0].double(), want[flags == 0], rtol=1e-4, atol=1e-5)
    if pass1 != "fixed_reference":
        assert not flags.any()
    if mask_kind == 1 and pass1 != "no_softmax":
        assert torch.equal(p[3], torch.zeros(N)) or flags[3]


def test_a_fixed_reference_flags_the_rows_it_leaves_wrong(gluon_on_cpu):
    """Pass 1 against the max of a row's first key tile: a later score 2^128 or more above it overflows the sum, and
    a row whose first tile is hidden (reference 0) with every other score far below it sums to 0. Both rows are
    flagged (the Triton kernel re-writes them), and only they."""
    N, D = 64, 16
    q, k, _, _ = _case(N, D, 0, seed=2)
    mask = torch.zeros(N, N)
    mask[7, 40] = 200.0  # 200 · log2 e ≈ 289 above the first tile's max: 2^289 overflows float32
    mask[9, :32] = -math.inf
    mask[9, 32:] = -200.0  # the reference is 0 (first tile hidden); 2^(−289) is below float32's smallest
    p, flags = _p_kernel(gluon_on_cpu, q, k, mask, False, False, True)
    assert flags.nonzero().flatten().tolist() == [7, 9]
    want = reference.softmax(reference.scores(q, k, attn_mask=mask)[0, 0])
    torch.testing.assert_close(p[flags == 0].double(), want[flags == 0], rtol=1e-4, atol=1e-5)
    # and the running max has no such rows
    p, flags = _p_kernel(gluon_on_cpu, q, k, mask, False, False, False)
    assert not flags.any()
    torch.testing.assert_close(p.double(), want, rtol=1e-4, atol=1e-5)


# -- the one-pass P kernel's row statistics ------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_the_one_pass_kernels_per_tile_exponentials_merge_into_the_rows_softmax(gluon_on_cpu, causal):
    """qk_softmax_row: each key tile's (max, 2^(s − max), sum) from _tile_exp, the tiles' statistics folded by
    _merge in any grouping (the two consumers each merge their own tiles, then swap), and each tile's P rescaled by
    2^(m_j − m) / l: the fp64 oracle's softmax; a part the mask hides entirely merges as (−inf, 0), never NaN."""
    N, D, BLOCK_M, BLOCK_N = 90, 16, 16, 32
    q, k, _, _ = _case(N, D, 0, seed=3)
    scale = D ** -0.5
    want = reference.softmax(reference.scores(q, k, causal=causal)[0, 0])
    for rows in range(0, N, BLOCK_M):
        hi = min(N, rows + BLOCK_M) if causal else N
        n_tiles = -(-hi // BLOCK_N)
        offs_m, cols = rows + torch.arange(BLOCK_M), torch.arange(BLOCK_N)
        tiles = [qk_softmax_row._tile_exp(_score_tile(q, k, rows, j, BLOCK_M, BLOCK_N), j, rows, hi, offs_m, cols,
                                          N, scale * LOG2E, BLOCK_N, causal, False) for j in range(n_tiles)]
        even, odd = tiles[0::2], tiles[1::2]  # two consumers' shares of the key tiles
        parts = []
        for share in (even, odd):
            m, l = torch.full((BLOCK_M,), -math.inf), torch.zeros(BLOCK_M)
            for m_j, _, l_j in share:
                m, l = qk_softmax_row._merge(m, l, m_j, l_j)
            parts.append((m, l))
        m, l = qk_softmax_row._merge(*parts[0], *parts[1])
        assert not torch.isnan(m).any() and not torch.isnan(l).any()
        keep = min(BLOCK_M, N - rows)
        for j, (m_j, p_j, _) in enumerate(tiles):
            p = p_j * torch.exp2(m_j - m)[:, None] / l[:, None]
            c = slice(j * BLOCK_N, min(N, (j + 1) * BLOCK_N))
            torch.testing.assert_close(p[:keep, : c.stop - c.start].double(), want[rows: rows + keep, c],
                                       rtol=1e-4, atol=1e-6)
    hidden = torch.full((4,), -math.inf), torch.zeros(4)
    m, l = qk_softmax_row._merge(*hidden, *hidden)
    assert torch.equal(l, torch.zeros(4)) and torch.isinf(m).all() and not torch.isnan(m).any()
