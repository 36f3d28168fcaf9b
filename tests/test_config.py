"""The tiles: the rules' lookups, the autotune's overrides, and where our kernels can run."""
import pytest
import torch

from attnlab.triton import config, launch, plan
from attnlab.validate import check
from tests.conftest import rand_qkv


def test_forced_tiles_apply_inside_the_block_and_restore_after():
    """The autotune sweep relies on this: a forced candidate must be the one the launcher uses."""
    q, k, v = rand_qkv(N=8, D=16)
    spec = check(q, k, v)

    def tiles():
        return {kn: p.tiles for kn, p in {**launch.plans("fused", spec), **launch.plans("qk_softmax", spec)}.items()}

    before = tiles()
    cand = config.Tiles(16, 16, 8, 3)
    with plan.forced("fused", cand):
        assert tiles() == {**before, "fused": cand}  # other kernels untouched
    with plan.forced("pv", cand):
        assert tiles() == {**before, "pv": cand}
    assert tiles() == before


def test_the_cpu_is_the_interpreter_family_and_head_dims_round_up_to_a_power_of_two():
    assert config.family(torch.device("cpu")) == "interpreter"
    assert config.head_dim_bucket(80) == 128 and config.head_dim_bucket(8) == 16 and config.head_dim_bucket(64) == 64
    assert all(config.head_dim_bucket(d) >= max(d, 16) for d in range(1, 257))


HEAD_DIMS = (1, 8, 16, 17, 32, 33, 48, 63, 64, 65, 80, 96, 127, 128, 129, 192, 255, 256)


@pytest.mark.parametrize("kernel", ["fused", "qk_softmax", "scores", "pv"])
def test_every_supported_case_finds_tiles_its_kernel_takes(kernel):
    """Whatever the rules say: every family (the interpreter, any sm80+ GPU), head dim 1…256, causal or not, dtype
    size and N finds an entry; its blocks are powers of two of at least 16 rows (tl.dot's smallest), 4 or 8 warps
    (one warpgroup a Gluon partition), at least 2 stages; the Triton fused kernel's BLOCK_M a multiple of its BLOCK_N
    (its launcher refuses others); a Gluon entry only on sm90, for 16-bit D = 64 or 128."""
    from attnlab.triton.hopper import common

    for fam in ("interpreter", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"):
        for D in HEAD_DIMS:
            for causal in (False, True):
                for dtype in (torch.float32, torch.float16, torch.bfloat16):
                    for N in (None, 1, 500, 512, 1024, 4096, 65536):
                        t = plan.lookup(kernel, fam, D, causal, dtype.itemsize, N=N)
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
    q, k, v = rand_qkv(N=8, D=16)
    with plan.overriding(plan.read_overrides(str(path))):
        assert launch.plans("fused", check(q, k, v))["fused"].tiles == config.Tiles(16, 16)
        assert launch.plans("fused", check(q, k, v, causal=True))["fused"].tiles != config.Tiles(16, 16)
    assert launch.plans("fused", check(q, k, v))["fused"].tiles != config.Tiles(16, 16)


def test_heavy_first_launch_order_gives_the_same_output():
    """Launching query blocks last-first only reorders programs: every block must still be computed, and each
    exactly as before (several blocks, a ragged last one, causal and not, with and without a mask)."""
    q, k, v = rand_qkv(B=1, H=2, N=50, D=16, dtype=torch.float32, seed=3)
    mask = torch.randn(50, 50, generator=torch.Generator().manual_seed(3)) > -1.0
    for causal in (False, True):
        for attn_mask in (None, mask):
            ref = launch.fused(q, k, v, causal=causal, attn_mask=attn_mask)
            with plan.forced("fused", config.Tiles(16, 16, heavy_first=True)):
                out = launch.fused(q, k, v, causal=causal, attn_mask=attn_mask, out=torch.full_like(q, float("nan")))
            with plan.forced("fused", config.Tiles(16, 16)):
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
                with plan.forced("fused", config.Tiles(32, 16)):
                    single = launch.fused(q, k, v, **kw)
                for paired_tiles in (config.Tiles(32, 16, paired=True), config.Tiles(32, 16, heavy_first=True,
                                                                                     paired=True)):
                    with plan.forced("fused", paired_tiles):
                        paired = launch.fused(q, k, v, out=torch.full_like(q, float("nan")), **kw)
                    assert not torch.isnan(paired).any()
                    torch.testing.assert_close(paired, single, rtol=1e-5, atol=1e-5)
                if attn_mask is not None and ablation is None:
                    assert torch.equal(paired[:, :, 20], torch.zeros_like(paired[:, :, 20]))


def test_paired_programs_own_twice_the_rows():
    """The plan's grid follows the tiles: cdiv(N, 2·BLOCK_M) programs per head when paired."""
    spec = check(*rand_qkv(H=3, N=40, D=16))
    with plan.forced("fused", config.Tiles(16, 16, paired=True)):
        paired = launch.plans("fused", spec)["fused"].grid
    with plan.forced("fused", config.Tiles(16, 16)):
        single = launch.plans("fused", spec)["fused"].grid
    assert paired == (2, 3) and single == (3, 3)


def test_fused_tiles_whose_block_m_is_no_multiple_of_block_n_are_refused_clearly():
    q, k, v = rand_qkv(N=40, D=16)
    with plan.forced("fused", config.Tiles(16, 32)):
        with pytest.raises(ValueError, match=r"BLOCK_M % BLOCK_N == 0, got 16x32"):
            launch.fused(q, k, v)


def test_a_plan_is_made_once_a_key_and_follows_the_overrides_in_force():
    """A second call of the same shape finds the plan the first made (the same object); overrides in force make
    plans of their own, and the rules' come back after them."""
    spec = check(*rand_qkv(N=40, D=16))
    first = launch.plans("fused", spec)["fused"]
    assert launch.plans("fused", spec)["fused"] is first
    with plan.forced("fused", config.Tiles(16, 16, 1, 1)):
        assert launch.plans("fused", spec)["fused"].tiles == config.Tiles(16, 16, 1, 1)
    assert launch.plans("fused", spec)["fused"] is first


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
    """One wave or less: where fused's long-sequence tiles would give at most one wave of work items (B·H ·
    cdiv(N, rows an item) ≤ the programs the SMs hold), the short causal tiles serve past their bound; more items, no
    SM count (a CPU), a key without short tiles, another kernel, gluon=False and a forced entry keep their answers."""
    monkeypatch.setattr(config, "gluon_verified", lambda: True)
    table = plan.lookup("fused", "sm90", 128, True, 2)
    short = plan.lookup("fused", "sm90", 128, True, 2, N=plan.FUSED_ONE_CONSUMER_BELOW[128] - 1)
    assert config.item_rows(table) == 128 and config.item_rows(short) == 64
    assert config.item_rows(config.Tiles(128, 64, paired=True)) == 256 and config.item_rows(config.Tiles(64, 32)) == 64
    assert config.one_wave(table, 1024, 16, 132) and config.one_wave(table, 1000, 16, 132)  # 16 · 8 = 128 items
    assert not config.one_wave(table, 1024, 17, 132)  # 136 items
    assert config.one_wave(short, 1024, 16, 132) and not config.one_wave(short, 1024, 17, 132)  # 256, 272 of 264

    def fused(N, D=128, causal=True, **kw):
        return plan.lookup("fused", "sm90", D, causal, 2, N=N, **kw)

    assert fused(1024, heads=16, sms=132) == short and fused(16384, heads=1, sms=132) == short
    assert fused(1024, heads=17, sms=132) == table and fused(1024, heads=16, sms=100) == table
    assert fused(1024, heads=16) == table == fused(1024, sms=132)
    assert fused(2048, D=64, heads=8, sms=132) == fused(plan.FUSED_ONE_CONSUMER_BELOW[64] - 1, D=64)
    assert fused(1024, causal=False, heads=1, sms=132) == plan.lookup("fused", "sm90", 128, False, 2)
    assert plan.lookup("fused", "sm90", 128, True, 2, gluon=False, N=1024, heads=1, sms=132) == plan.lookup(
        "fused", "sm90", 128, True, 2, gluon=False)
    qk = plan.lookup("qk_softmax", "sm90", 64, True, 2, N=4096)
    assert plan.lookup("qk_softmax", "sm90", 64, True, 2, N=4096, heads=1, sms=132) == qk
    forced = config.Tiles(64, 64, 4, 3)
    with plan.forced("fused", forced):
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
