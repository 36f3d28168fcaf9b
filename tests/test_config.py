"""The tile table: lookups, the autotune override, and where our kernels can run."""
import pytest
import torch

from attnlab.triton import config, launch
from attnlab.validate import check
from tests.conftest import rand_qkv


def test_forced_tiles_apply_inside_the_block_and_restore_after():
    """The autotune sweep relies on this: a forced candidate must be the one the launcher uses."""
    q, k, v = rand_qkv(N=8, D=16)
    spec = check(q, k, v)
    before, pv_before = launch._lookup("fused", spec), launch._pv_tiles(spec)
    cand = config.Tiles(16, 16, 8, 3)
    with config.forced("fused", cand):
        assert launch._lookup("fused", spec) == cand
        assert launch._pv_tiles(spec) == pv_before  # other kernels untouched
    with config.forced("pv", cand):
        assert launch._pv_tiles(spec) == cand
    assert launch._lookup("fused", spec) == before


def test_the_cpu_is_the_interpreter_family_and_head_dims_round_up_to_a_power_of_two():
    assert config.family(torch.device("cpu")) == "interpreter"
    assert config.head_dim_bucket(80) == 128 and config.head_dim_bucket(8) == 16 and config.head_dim_bucket(64) == 64
    assert all(config.head_dim_bucket(d) >= max(d, 16) for d in range(1, 257))


HEAD_DIMS = (1, 8, 16, 17, 32, 33, 48, 63, 64, 65, 80, 96, 127, 128, 129, 192, 255, 256)


@pytest.mark.parametrize("kernel", ["fused", "qk_softmax", "scores", "pv"])
def test_every_supported_case_finds_tiles_its_kernel_takes(kernel):
    """Whatever the tables hold: every family (the interpreter, any sm80+ GPU), head dim 1…256, causal or not, dtype
    size and N finds an entry; its blocks are powers of two of at least 16 rows (tl.dot's smallest), 4 or 8 warps
    (one warpgroup a Gluon partition), at least 2 stages; the Triton fused kernel's BLOCK_M a multiple of its BLOCK_N
    (its launcher refuses others); a Gluon entry only on sm90, for 16-bit D = 64 or 128."""
    from attnlab.triton.hopper import common

    for fam in ("interpreter", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"):
        for D in HEAD_DIMS:
            for causal in (False, True):
                for dtype in (torch.float32, torch.float16, torch.bfloat16):
                    for N in (None, 1, 500, 512, 1024, 4096, 65536):
                        t = config.lookup(kernel, fam, D, causal, dtype.itemsize, N=N)
                        case = (kernel, fam, D, causal, dtype, N, t)
                        assert all(b >= 16 and b & (b - 1) == 0 for b in (t.BLOCK_M, t.BLOCK_N)), case
                        assert t.num_warps in (4, 8) and t.num_stages >= 2, case
                        assert kernel != "fused" or t.gluon or t.BLOCK_M % t.BLOCK_N == 0, case
                        assert not t.gluon or (fam == "sm90" and common.compiles_for(dtype, D)), case


def test_tile_config_is_recorded_per_kernel():
    q, k, v = rand_qkv(N=8, D=16)
    spec = check(q, k, v)
    assert set(launch.tile_config("materialised", spec)) == {"scores", "pv"}
    assert set(launch.tile_config("qk_softmax", spec)) == {"qk_softmax", "pv"}
    assert launch.tile_config("fused", spec)["fused"]["BLOCK_M"] % launch.tile_config("fused", spec)["fused"]["BLOCK_N"] == 0


def test_autotune_overrides_file_goes_in_front(tmp_path):
    import json

    entry = dict(kernel="fused", family="interpreter", D=16, causal=False, itemsize=4,
                 tiles=dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2))
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps([entry]))
    saved = config.TABLE
    try:
        config.load_overrides(str(path))
        assert config.tiles("fused", torch.device("cpu"), 16, False, torch.float32) == config.Tiles(16, 16)
        assert config.tiles("fused", torch.device("cpu"), 16, True, torch.float32) != config.Tiles(16, 16)
    finally:
        config.TABLE = saved


def test_heavy_first_launch_order_gives_the_same_output():
    """Launching query blocks last-first only reorders programs: every block must still be computed, and each
    exactly as before (several blocks, a ragged last one, causal and not, with and without a mask)."""
    q, k, v = rand_qkv(B=1, H=2, N=50, D=16, dtype=torch.float32, seed=3)
    mask = torch.randn(50, 50, generator=torch.Generator().manual_seed(3)) > -1.0
    for causal in (False, True):
        for attn_mask in (None, mask):
            ref = launch.fused(q, k, v, causal=causal, attn_mask=attn_mask)
            with config.forced("fused", config.Tiles(16, 16, heavy_first=True)):
                out = launch.fused(q, k, v, causal=causal, attn_mask=attn_mask, out=torch.full_like(q, float("nan")))
            with config.forced("fused", config.Tiles(16, 16)):
                same = launch.fused(q, k, v, causal=causal, attn_mask=attn_mask)
            assert not torch.isnan(out).any()
            assert torch.equal(out, same)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_paired_rows_give_the_same_output_as_single_blocks():
    """The paired loop (two row blocks per program over shared K/V tiles) against the single-block loop on the same
    tile sizes: rows past N in the second block (N = 50 is no multiple of 2·32; a block's diagonal spans two key
    tiles), causal and not, a boolean mask, GQA,
    both ablations that change the loop's body; every element written."""
    q, k, v = rand_qkv(B=1, H=2, Hkv=1, N=50, D=16, dtype=torch.float32, seed=5)
    mask = torch.randn(50, 50, generator=torch.Generator().manual_seed(7)) > -1.0
    mask[20] = False  # one row with no key at all: zeros, in both loops, causal or not
    for causal in (False, True):
        for attn_mask in (None, mask):
            for ablation in (None, "no_softmax", "no_pv"):
                kw = dict(causal=causal, attn_mask=attn_mask, ablation=ablation)
                with config.forced("fused", config.Tiles(32, 16)):
                    single = launch.fused(q, k, v, **kw)
                for paired_tiles in (config.Tiles(32, 16, paired=True), config.Tiles(32, 16, heavy_first=True,
                                                                                     paired=True)):
                    with config.forced("fused", paired_tiles):
                        paired = launch.fused(q, k, v, out=torch.full_like(q, float("nan")), **kw)
                    assert not torch.isnan(paired).any()
                    torch.testing.assert_close(paired, single, rtol=1e-5, atol=1e-5)
                if attn_mask is not None and ablation is None:
                    assert torch.equal(paired[:, :, 20], torch.zeros_like(paired[:, :, 20]))


def test_paired_programs_own_twice_the_rows(monkeypatch):
    """The launcher's grid follows the tiles: cdiv(N, 2·BLOCK_M) programs per head when paired."""
    grids = []
    real = launch._grid_m
    monkeypatch.setattr(launch, "_grid_m", lambda spec, rows: grids.append(rows) or real(spec, rows))
    q, k, v = rand_qkv(N=40, D=16)
    with config.forced("fused", config.Tiles(16, 16, paired=True)):
        launch.fused(q, k, v)
    with config.forced("fused", config.Tiles(16, 16)):
        launch.fused(q, k, v)
    assert grids == [32, 16]


def test_fused_tiles_whose_block_m_is_no_multiple_of_block_n_are_refused_clearly():
    q, k, v = rand_qkv(N=40, D=16)
    with config.forced("fused", config.Tiles(16, 32)):
        with pytest.raises(ValueError, match=r"BLOCK_M % BLOCK_N == 0, got 16x32"):
            launch.fused(q, k, v)


def test_remembered_lookups_answer_as_a_scan_of_the_tables_does_and_follow_new_tables(tmp_path, monkeypatch):
    cases = [(kernel, fam, D, causal, size, gluon, N) for kernel in ("fused", "qk_softmax", "scores", "pv")
             for fam in ("sm90", "sm80", "interpreter") for D in (64, 80, 128) for causal in (False, True)
             for size in (2, 4) for gluon in (True, False) for N in (None, 256, 600, 4096)]
    assert all(config.lookup(*c) == config._scan(*c) for c in cases)
    forced = config.Tiles(16, 16, 1, 1)
    with config.forced("fused", forced):  # a new table: the remembered answers of the old one are not used
        assert config.lookup("fused", "sm90", 128, True, 2) == forced
    for other in (config.Tiles(32, 32, 2, 1), config.Tiles(16, 32, 1, 2)):  # a freed table's id may come again
        with config.forced("fused", other):
            assert config.lookup("fused", "sm90", 128, True, 2) == other
    assert config.lookup("fused", "sm90", 128, True, 2) == config._scan("fused", "sm90", 128, True, 2, True, None)
    monkeypatch.setattr(config, "LOOKUPS_KEPT", 3)  # a full memory is emptied, not grown
    monkeypatch.setattr(config, "_looked_up", {})
    for c in cases[:10]:
        config.lookup(*c)
    assert len(config._looked_up) <= 3


def test_tiles_as_a_dict_is_every_field_and_fresh_each_time():
    from dataclasses import asdict

    t = config.Tiles(64, 128, 4, 2, gluon=True, persistent=True)
    d = t.as_dict()
    assert d == asdict(t) and list(d) == list(asdict(t))
    d.pop("gluon")
    assert t.as_dict()["gluon"] is True


def test_a_gpus_compute_capability_is_asked_once_and_names_its_family(monkeypatch):
    asked = []
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: asked.append(i) or ((9, 0), (7, 5))[i])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    config._capability_at.cache_clear()
    try:
        assert [config.family(torch.device("cuda", 0)) for _ in range(3)] == ["sm90"] * 3
        assert config.family(torch.device("cuda")) == "sm75"  # the current device's
        assert "compute capability >= 8.0" in config.unsupported_reason(torch.device("cuda", 1))
        assert asked == [0, 1]
    finally:
        config._capability_at.cache_clear()


def test_a_grid_of_one_wave_takes_its_keys_short_entry_at_any_n(monkeypatch):
    """config.ONE_WAVE: where fused's TABLE entry would give at most one wave of work items (B·H · cdiv(N, rows an
    item) ≤ the programs the SMs hold), the key's SHORT entry serves past its bound; more items, no SM count (a CPU),
    a key without a SHORT entry, a kernel not in ONE_WAVE, gluon=False and a forced entry keep their answers."""
    monkeypatch.setattr(config, "gluon_verified", lambda: True)
    table = config.lookup("fused", "sm90", 128, True, 2)
    short = config.SHORT[("fused", "sm90", "=128", True, 2)][0]
    assert config.item_rows(table) == 128 and config.item_rows(short) == 64
    assert config.item_rows(config.Tiles(128, 64, paired=True)) == 256 and config.item_rows(config.Tiles(64, 32)) == 64
    assert config.one_wave(table, 1024, 16, 132) and config.one_wave(table, 1000, 16, 132)  # 16 · 8 = 128 items
    assert not config.one_wave(table, 1024, 17, 132)  # 136 items
    assert config.one_wave(short, 1024, 16, 132) and not config.one_wave(short, 1024, 17, 132)  # 256, 272 of 264

    def fused(N, D=128, causal=True, **kw):
        return config.lookup("fused", "sm90", D, causal, 2, N=N, **kw)

    assert fused(1024, heads=16, sms=132) == short and fused(16384, heads=1, sms=132) == short
    assert fused(1024, heads=17, sms=132) == table and fused(1024, heads=16, sms=100) == table
    assert fused(1024, heads=16) == table == fused(1024, sms=132)
    assert fused(2048, D=64, heads=8, sms=132) == config.SHORT[("fused", "sm90", "=64", True, 2)][0]
    assert fused(1024, causal=False, heads=1, sms=132) == config.lookup("fused", "sm90", 128, False, 2)
    assert config.lookup("fused", "sm90", 128, True, 2, gluon=False, N=1024, heads=1, sms=132) == config.lookup(
        "fused", "sm90", 128, True, 2, gluon=False)
    qk = config.lookup("qk_softmax", "sm90", 64, True, 2, N=4096)
    assert config.lookup("qk_softmax", "sm90", 64, True, 2, N=4096, heads=1, sms=132) == qk
    forced = config.Tiles(64, 64, 4, 3)
    with config.forced("fused", forced):
        assert fused(1024, heads=1, sms=132) == forced


def test_a_gpus_sm_count_is_asked_once_and_a_cpu_has_none(monkeypatch):
    asked = []

    class Props:
        multi_processor_count = 132

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: asked.append(i) or Props())
    config._sms_at.cache_clear()
    try:
        assert [config.sm_count(torch.device("cuda", 0)) for _ in range(3)] == [132] * 3 and asked == [0]
        assert config.sm_count(torch.device("cpu")) is None
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert config.sm_count(torch.device("cuda", 0)) is None
    finally:
        config._sms_at.cache_clear()
