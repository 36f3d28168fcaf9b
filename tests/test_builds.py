"""Every build against the fp64 oracle, on fresh random inputs, with outputs poisoned and checked fully written."""
import pytest
import torch

from attnlab import accuracy, builds, reference
from attnlab.triton import config, launch, layout, plan
from tests.conftest import poisoned_out, rand_qkv

OURS = builds.OURS
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def run_ours(name, q, k, v, **kw):
    """Call one of our builds into a NaN-poisoned buffer and check every element was written."""
    out = poisoned_out(q)
    o = builds.get(name).attend(q, k, v, out=out, **kw)
    assert o.data_ptr() == out.data_ptr()
    assert torch.isfinite(o).all(), f"{name}: unwritten (NaN) or non-finite elements in O"
    return o


def assert_accurate(name, o, q, k, v, **kw):
    ablation = builds.get(name).ablation
    ablation = None if ablation == "zero_mask" else ablation
    verdict = accuracy.judge(o, q, k, v, ablation=ablation, **kw)
    assert verdict.ok, f"{name}: err {verdict.err:.3e} > limit {verdict.limit:.3e} (torch lowp {verdict.err_lowp:.3e})"
    return verdict


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("N", [1, 100])  # one row; one ragged tile of the interpreter's 128 (more: the next tests)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", OURS)
def test_ours_match_reference(name, D, N, causal, dtype):
    q, k, v = rand_qkv(B=2, H=2, N=N, D=D, dtype=dtype, seed=N * 7 + D)
    o = run_ours(name, q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", OURS)
def test_ours_multi_tile_ragged(name, causal, small_tiles):
    """32×16 tiles at N = 100: many key tiles per row block, a ragged tail, and diagonal tiles mid-sequence."""
    q, k, v = rand_qkv(B=1, H=2, N=100, D=32, dtype=torch.float16, seed=3)
    o = run_ours(name, q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", OURS)
def test_ours_long_sequence(name, causal):
    """The table's own tiles over several key tiles: N = 300 is no multiple of any block size (two whole tiles of
    128 and a ragged third; the multi-tile loops with small tiles: test_ours_multi_tile_ragged)."""
    q, k, v = rand_qkv(B=1, H=2, N=300, D=64, dtype=torch.bfloat16, seed=11)
    o = run_ours(name, q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


@pytest.mark.parametrize("D", [16, 32, 80, 256])
@pytest.mark.parametrize("name", OURS)
def test_ours_other_head_dims(name, D):
    """Powers of two down to tl.dot's 16, 256, and a D that is padded to the next power of two (80 → 128)."""
    q, k, v = rand_qkv(B=1, H=2, N=40, D=D, dtype=torch.bfloat16, seed=D)
    o = run_ours(name, q, k, v, causal=True)
    assert_accurate(name, o, q, k, v, causal=True)


@pytest.mark.parametrize("Hkv", [1, 2])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", OURS)
def test_ours_grouped_query(name, causal, Hkv):
    q, k, v = rand_qkv(B=2, H=4, Hkv=Hkv, N=50, D=32, dtype=torch.float16, seed=Hkv)
    o = run_ours(name, q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


def test_grouped_query_means_shared_heads():
    """GQA must equal plain attention with each k/v head repeated for its group (not merely be self-consistent)."""
    q, k, v = rand_qkv(B=1, H=4, Hkv=2, N=33, D=32, seed=5)
    o = builds.get("fused").attend(q, k, v)
    o_rep = builds.get("fused").attend(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(o, o_rep)


def _masks(B, H, N, seed):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(B, H, N, N, generator=g) > 0.3
    keep[..., 0] = True  # at least one key per row, except where a test masks a row on purpose
    return {
        "bool_full": keep,
        "bool_NN": keep[0, 0],
        "bool_B1NN": keep[:, :1],
        "add_full": torch.randn(B, H, N, N, generator=g),
        "add_1H1N": torch.randn(1, H, 1, N, generator=g),
        "add_NN_neginf": torch.where(keep[0, 0], 0.0, float("-inf")),
    }


@pytest.mark.parametrize("mask", list(_masks(1, 1, 4, 0)))
@pytest.mark.parametrize("name", OURS)
def test_ours_explicit_masks(name, mask):
    q, k, v = rand_qkv(B=2, H=2, N=45, D=32, dtype=torch.float32, seed=9)
    m = _masks(2, 2, 45, 1)[mask]
    o = run_ours(name, q, k, v, attn_mask=m)
    assert_accurate(name, o, q, k, v, attn_mask=m)


@pytest.mark.parametrize("name", OURS)
def test_mask_and_causal_together(name):
    q, k, v = rand_qkv(B=1, H=2, N=45, D=32, dtype=torch.float16, seed=2)
    m = _masks(1, 2, 45, 3)["add_full"].to(torch.float16)
    o = run_ours(name, q, k, v, attn_mask=m, causal=True)
    assert_accurate(name, o, q, k, v, attn_mask=m, causal=True)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("name", OURS + ("torch_eager",))
def test_fully_masked_rows_give_zeros_not_nan(name, kind, small_tiles):
    """Documented semantics: a row with no key to attend to gives O = 0 (ours and the oracle), never NaN."""
    q, k, v = rand_qkv(B=1, H=2, N=40, D=32, seed=4)
    keep = torch.rand(40, 40, generator=torch.Generator().manual_seed(0)) > 0.5
    keep[:, 0] = True
    keep[[3, 17, 39]] = False  # three rows see nothing, one of them in the ragged last block
    m = keep if kind == "bool" else torch.where(keep, 0.0, float("-inf"))
    ref = reference.attend(q, k, v, attn_mask=m)
    assert (ref[:, :, [3, 17, 39]] == 0).all()
    if name == "torch_eager":  # plain torch gives NaN there: the library's behaviour, not ours (documented)
        assert builds.get(name).attend(q, k, v, attn_mask=m)[:, :, 3].isnan().all()
        return
    o = run_ours(name, q, k, v, attn_mask=m)
    assert (o[:, :, [3, 17, 39]] == 0).all()
    assert_accurate(name, o, q, k, v, attn_mask=m)


def test_softmax_streams_rows_longer_than_one_block(monkeypatch, fresh_plans):
    """The materialised softmax reads a row once when it fits a block, else in two streamed passes: test both."""
    q, k, v = rand_qkv(B=1, H=2, N=100, D=32, seed=6)
    m = _masks(1, 2, 100, 2)["add_NN_neginf"]
    one = run_ours("materialised", q, k, v, attn_mask=m)
    monkeypatch.setattr(plan, "SOFTMAX_ROW_MAX", 32)
    plan.forget()
    two = run_ours("materialised", q, k, v, attn_mask=m)
    assert_accurate("materialised", two, q, k, v, attn_mask=m)
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6)
    ab = run_ours("materialised-no_softmax", q, k, v)
    assert_accurate("materialised-no_softmax", ab, q, k, v)


def test_custom_scale_and_noncontiguous_inputs():
    q, k, v = rand_qkv(B=2, H=3, N=30, D=32, seed=8)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, D) view with a head stride smaller than N's
    for name in OURS:
        o = run_ours(name, qt, k, v, scale=0.3)
        assert_accurate(name, o, q, k, v, scale=0.3)


# -- ablations: legal programs with their own oracles ------------------------------------------------------------

ABLATED = [f"{b}-{a}" for b in OURS for a in builds.ABLATIONS]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", ABLATED)
def test_ablations_match_their_oracles(name, causal, small_tiles):
    q, k, v = rand_qkv(B=1, H=2, Hkv=1, N=70, D=32, dtype=torch.float16, seed=12)
    o = run_ours(name, q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


def test_ablations_change_the_function():
    """Each ablation computes something other than attention (else it would not remove the stage it names)."""
    q, k, v = rand_qkv(B=1, H=2, N=50, D=32, seed=13)
    base = builds.get("fused").attend(q, k, v)
    for a in ("no_softmax", "no_pv"):
        assert (builds.get(f"fused-{a}").attend(q, k, v) - base).abs().max() > 1e-2
    torch.testing.assert_close(builds.get("fused-zero_mask").attend(q, k, v), base)


def test_zero_mask_refuses_a_second_mask():
    q, k, v = rand_qkv(N=8, D=16)
    with pytest.raises(ValueError, match="attn_mask must be None"):
        builds.get("fused-zero_mask").attend(q, k, v, attn_mask=torch.zeros(8, 8))


# -- library rows --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", ["torch_eager", "sdpa_default", "sdpa_math", "sdpa_flash"])
def test_library_rows_on_cpu(name, causal):
    q, k, v = rand_qkv(B=1, H=4, Hkv=2, N=37, D=64, dtype=torch.bfloat16, seed=14)
    o = builds.get(name).attend(q, k, v, causal=causal)
    assert_accurate(name, o, q, k, v, causal=causal)


@pytest.mark.parametrize("name", ["sdpa_cudnn", "sdpa_efficient"])
def test_forced_backend_that_cannot_run_says_why(name):
    q, k, v = rand_qkv(N=16, D=16)
    with pytest.raises(builds.Unsupported, match=name):
        builds.get(name).attend(q, k, v)


def test_sdpa_refuses_mask_with_causal():
    q, k, v = rand_qkv(N=16, D=16)
    with pytest.raises(builds.Unsupported, match="not both"):
        builds.get("sdpa_math").attend(q, k, v, causal=True, attn_mask=torch.zeros(16, 16))


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flex_compiled(causal):
    q, k, v = rand_qkv(B=1, H=2, N=128, D=32, dtype=torch.float32, seed=15)
    o = builds.get("flex").attend(q, k, v, causal=causal)
    assert_accurate("flex", o, q, k, v, causal=causal)


def test_triton_without_gpu_or_interpreter_is_unsupported(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = rand_qkv(N=8, D=16)
    with pytest.raises(builds.Unsupported, match="TRITON_INTERPRET"):
        builds.get("fused").attend(q, k, v)


def test_table_is_ordered_and_complete():
    expected = ["materialised", "qk_softmax", "fused", "torch_eager", "sdpa_default", "sdpa_flash",
                "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "flex"]
    assert [n for n in builds.names() if "-" not in n] == expected
    assert {builds.get(n).holds for n in OURS} == {"S+P", "P", "none"}


def test_every_build_has_what_it_holds_in_the_model_and_the_model_names_no_other():
    """attnlab.cost.HOLDS is where a build's holds live: every build in the table has one, every ablation holds what
    its base holds, and the model knows no base that is not a build."""
    from attnlab import cost

    assert {b.base for b in builds.BUILDS.values()} == set(cost.HOLDS)
    for b in builds.BUILDS.values():
        assert b.holds == cost.HOLDS[b.base]
    assert builds.get("torch_eager").holds == builds.get("sdpa_math").holds == "S+P"  # both write S and P out
    assert len(ABLATED) == 9 and all(n in builds.BUILDS for n in ABLATED)


def test_bench_oracle_check_slices_like_the_harness(monkeypatch):
    """bench's per-shape accuracy check: on a head slice (whole GQA groups) when the oracle would be too big."""
    from attnlab import measure

    q, k, v = rand_qkv(B=2, H=4, Hkv=2, N=40, D=32, seed=21)
    o = builds.get("fused").attend(q, k, v)
    assert measure.oracle_check("fused", o, q, k, v, False).ok
    monkeypatch.setattr(measure, "REF_BUDGET", 40 * 40 * 8 * 2)  # two heads' scores: batch 0, heads 0:2
    assert measure.oracle_check("fused", o, q, k, v, False).ok
    wrong = o.clone()
    wrong[0, 1] += 1.0  # inside the slice: must be caught
    assert not measure.oracle_check("fused", wrong, q, k, v, False).ok


@pytest.mark.parametrize("seed", range(8))
def test_random_cases_match_the_oracle(seed):
    """Shapes, dtypes, masks and GQA drawn at random (seeded): the builds must compute attention on any valid input,
    not only on the grid above."""
    import random

    r = random.Random(seed)
    Hkv = r.choice([1, 2])
    H = Hkv * r.choice([1, 2, 3])
    N, D = r.randint(1, 160), r.choice([16, 32, 64, 80, 128])  # up to two of the interpreter's 128-wide tiles
    dtype = r.choice(DTYPES)
    causal = r.random() < 0.5
    q, k, v = rand_qkv(B=r.choice([1, 2]), H=H, Hkv=Hkv, N=N, D=D, dtype=dtype, seed=100 + seed)
    mask = None
    if r.random() < 0.4:
        g = torch.Generator().manual_seed(seed)
        mask = torch.rand(N, N, generator=g) > 0.2 if r.random() < 0.5 else torch.randn(1, H, N, N, generator=g)
    for name in OURS:
        o = run_ours(name, q, k, v, causal=causal, attn_mask=mask)
        assert_accurate(name, o, q, k, v, causal=causal, attn_mask=mask)


@pytest.mark.parametrize("name", OURS)
def test_masked_first_tile_then_very_negative_scores(name):
    """A mask that hides every row's first key tile, then scores near -36: the running max must follow the real
    scores. (fused once kept the 0 it substitutes for an all--inf max, and in fp16 every p underflowed to 0.)"""
    q, k, v = rand_qkv(B=1, H=2, N=256, D=32, dtype=torch.float16, seed=31)
    g = torch.Generator().manual_seed(31)
    m = torch.full((256, 256), -36.0) + 0.5 * torch.randn(256, 256, generator=g)
    m[:, :128] = float("-inf")  # the whole first 128-wide key tile of every row
    o = run_ours(name, q, k, v, attn_mask=m)
    assert_accurate(name, o, q, k, v, attn_mask=m)


@pytest.mark.parametrize("name", OURS)
def test_batch_times_heads_past_the_grid_limit_is_refused_clearly(name):
    q, k, v = rand_qkv(B=65536, H=1, N=1, D=16)
    with pytest.raises(builds.Unsupported, match=r"B·H = 65536 exceeds 65535"):
        builds.get(name).attend(q, k, v)


def test_which_row_lengths_the_launcher_vouches_for():
    """rows_16b: only where Triton cannot see it itself (N % 16 ≠ 0) and it is true (N × element size % 16 == 0).
    rows_pad: where rows end inside a vector, and only for rows with room for the rest of that vector before the next
    row (scores_buffer's), never a caller's contiguous ones, a misaligned view, or one whose last row's room lies
    outside its storage."""
    assert [n for n in (8, 16, 24, 40, 100, 3000, 4096, 3001) if layout.rows_16b(n, torch.bfloat16)] == [8, 24, 40, 3000]
    assert [n for n in (4, 8, 100, 3000, 4096, 3001) if layout.rows_16b(n, torch.float32)] == [4, 8, 100, 3000]
    for N, dtype, ragged in ((2999, torch.bfloat16, True), (3000, torch.bfloat16, False), (100, torch.float16, True),
                             (99, torch.float32, True), (100, torch.float32, False)):
        assert layout.ragged_rows(N, dtype.itemsize) is ragged
        assert launch.rows_pad(N, launch.scores_buffer(_spec(N, dtype))) is ragged
    N = 37
    assert launch.rows_pad(N, launch.scores_buffer(_spec(N, torch.bfloat16)))
    assert not launch.rows_pad(N, torch.empty(1, 2, N, N, dtype=torch.bfloat16))  # rows 74 bytes apart
    room = torch.empty(1, 2, N, 64, dtype=torch.bfloat16)
    assert launch.rows_pad(N, room[..., :N]) and not launch.rows_pad(N, room[..., 1:N + 1])  # base off 16 bytes
    tight = torch.empty(2 * N * 64 - 64 + N, dtype=torch.bfloat16).as_strided((1, 2, N, N), (2 * N * 64, N * 64, 64, 1))
    assert not launch.rows_pad(N, tight)  # the last row's room past N lies outside the storage
    # padded_view: the same storage, rows widened to the vector's end (40 bf16 = 5 vectors) where rows_pad holds
    x = launch.scores_buffer(_spec(N, torch.bfloat16))
    wide = layout.padded_view(x, N)
    assert wide.shape == (*x.shape[:3], 40) and wide.stride() == x.stride() and wide.data_ptr() == x.data_ptr()
    assert layout.padded_view(tight, N) is tight and layout.padded_view(x[..., :32, :32], 32).shape[-1] == 32


@pytest.mark.parametrize("N,dtype", [(40, torch.bfloat16), (24, torch.float16), (100, torch.float32)], ids=str)
@pytest.mark.parametrize("name", ("materialised", "qk_softmax", "materialised-no_softmax"))
def test_rows_only_the_launcher_knows_are_aligned_give_the_same_result(name, N, dtype):
    """There the S/P kernels get N in a form the compiler sees is 16-byte aligned (attnlab.triton.tiles.row_length):
    the same value, so the same result, poisoned output fully written."""
    assert layout.rows_16b(N, dtype)
    q, k, v = rand_qkv(N=N, D=64, dtype=dtype)
    for causal in (False, True):
        o = run_ours(name, q, k, v, causal=causal)
        assert_accurate(name, o, q, k, v, causal=causal)


def test_s_and_p_rows_start_on_lines():
    """scores_buffer: rows of whole 128-byte lines (N = 3000's 6000-byte rows halved P's TMA store rate), the same
    N × N elements; contiguous wherever N · itemsize is already a multiple of 128."""
    def layout(N, dtype):
        x = launch.scores_buffer(_spec(N, dtype))
        return tuple(x.shape[2:]), x.stride(), x.is_contiguous()

    assert layout(3000, torch.bfloat16) == ((3000, 3000), (2 * 3000 * 3008, 3000 * 3008, 3008, 1), False)
    assert layout(4096, torch.bfloat16)[2] and layout(64, torch.float16)[2] and layout(32, torch.float32)[2]
    assert layout(100, torch.float32)[1][2] == 128 and layout(100, torch.bfloat16)[1][2] == 128
    assert layout(1, torch.float16)[1][2] == 64


def _spec(N, dtype):
    q, k, v = rand_qkv(N=N, D=16, dtype=dtype)
    return launch._prepare(q, k, v, False, None, None, None).spec


@pytest.mark.parametrize("N,dtype", [(100, torch.float16), (37, torch.bfloat16), (40, torch.bfloat16),
                                     (100, torch.float32), (99, torch.float32), (1, torch.float16),
                                     (3, torch.bfloat16), (2, torch.float32)], ids=str)
@pytest.mark.parametrize("name", ("materialised", "qk_softmax", "materialised-no_softmax", "qk_softmax-no_pv"))
def test_padding_past_the_rows_last_vector_is_never_written_and_its_last_vector_holds_what_the_reader_needs(
        monkeypatch, name, N, dtype):
    """Each S and P a build allocates is NaN throughout, padding included, before its kernels run: O must still be
    accurate, and the padding must still be NaN afterwards past the 16-byte vector that holds a row's last element.
    That vector the kernels read and write to its end where N × element size is not a multiple of 16 bytes
    (launch.rows_pad: N = 100 in fp16, 37 in bf16, 99 in fp32), so that they move whole vectors: its columns
    past N must hold -inf in S and 0 in P, which the PV kernel reads as it lies (layout.padded_view); where rows
    end on a vector nothing past N is written."""
    made, real = [], launch.scores_buffer

    def poisoned(spec):
        x = real(spec)
        x.as_strided((x.shape[0] * x.shape[1] * N * x.stride(2),), (1,)).fill_(float("nan"))  # all its storage
        made.append(x)
        return x

    monkeypatch.setattr(launch, "scores_buffer", poisoned)
    q, k, v = rand_qkv(N=N, D=64, dtype=dtype)
    for causal in (False, True):
        made.clear()
        o = run_ours(name, q, k, v, causal=causal)
        assert_accurate(name, o, q, k, v, causal=causal)
        assert len(made) == (2 if name.startswith("materialised") else 1)
        vec = 16 // dtype.itemsize
        end = -(-N // vec) * vec  # the end of the vector that holds a row's last element
        assert launch.rows_pad(N, *made) is (end > N)
        for x in made:
            row = x.stride(2)
            assert row > N and row * x.element_size() % 128 == 0
            pad = x.as_strided((*x.shape[:3], row - end), (*x.stride()[:3], 1), end)
            assert pad.isnan().all(), "a kernel wrote into a row's padding past its last vector"
            assert not x.isnan().any(), "an element of S or P was never written"
            tail = layout.padded_view(x, N)[..., N:]
            assert tail.shape[-1] == end - N
        if end > N:
            if name.startswith("materialised"):
                assert (layout.padded_view(made[0], N)[..., N:] == float("-inf")).all(), "S's padding is not -inf"
            assert (layout.padded_view(made[-1], N)[..., N:] == 0).all(), "P's padding is not 0 for the PV kernel"


@pytest.mark.parametrize("bad", ["transposed", "shape", "dtype"])
def test_a_p_whose_rows_the_kernels_cannot_index_is_one_clear_error(bad):
    q, k, v = rand_qkv(N=64, D=16, dtype=torch.float16)
    c = launch._prepare(q, k, v, False, None, None, None)
    p = {"transposed": torch.empty(1, 2, 64, 64, dtype=q.dtype).transpose(2, 3),
         "shape": torch.empty(1, 2, 64, 32, dtype=q.dtype),
         "dtype": torch.empty(1, 2, 64, 64)}[bad]
    with pytest.raises(ValueError, match=r"P must be a torch.float16 \(B, H, N, N\) = \(1, 2, 64, 64\) tensor"):
        launch.write_p(c, p, config.Tiles(32, 16))
    with pytest.raises(ValueError, match=r"P must be a torch.float16"):
        launch.pv(c.spec, p, c.v)
