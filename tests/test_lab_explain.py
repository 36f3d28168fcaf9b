"""attnlab.lab.explain and attnlab.lab.seeds: every explanation and seed section over the made-up GPU run of
tests/gpu_run.py, its numbers asserted against the byte model's formulas worked here. The run's N give different
answers at every N (B = 16384 / N, times growing as N²), so a section reading the wrong row fails."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attnlab import gate, lab
from attnlab.lab import explain, seeds
from tests import gpu_run

MIB, GIB = 1 << 20, 1 << 30
# the teaching shape of gpu_run: non-causal, D = 64, its largest N
N, D, B, H = 2048, 64, 16384 // 2048, 2048 // 64
FUSED_MS = gpu_run.times(N, False)["fused"]
MAT_MS = gpu_run.times(N, False)["materialised"]
HOPPER = {"device": {"device": "cuda:0", "name": gpu_run.DEVICE_NAME, "capability": "9.0", "multiprocessors": 132,
                     "total_memory": 80 * GIB}}
TILES = {"fused": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2, "gluon": True, "persistent": True}}


@pytest.fixture(scope="module")
def les(tmp_path_factory):
    folder = gpu_run.write_gpu_run(tmp_path_factory.mktemp("gpu") / "g")
    ref = lab.load(folder)
    return lab.Lessons(ref.results, folder, ref.device_name, False, ref.provenance)


def variant(les, rows=None, prov=None):
    return lab.Lessons(les.results if rows is None else rows, les.folder, les.device_name, les.own,
                       {**les.provenance, **(prov or {})})


def with_fused_tiles(les, tiles=TILES):
    rows = les.results.copy()
    rows.loc[rows["build"] == "fused", "tiles"] = json.dumps(tiles)
    return rows


def test_the_teaching_row_is_the_largest_n_at_the_smallest_head_dim_non_causal(les):
    row = lab.teaching_row(les)
    assert (int(row["N"]), int(row["D"]), bool(row["causal"]), row["build"]) == (N, D, False, "fused")
    rows = les.results
    causal = lab.teaching_row(variant(les, rows[rows["causal"].astype(bool)]))
    assert bool(causal["causal"]) and int(causal["N"]) == N  # causal only where nothing else was measured
    wide = lab.teaching_row(variant(les, rows[rows["D"] == 128]))
    assert int(wide["D"]) == 128 and int(wide["B"]) == B and int(wide["H"]) == 2048 // 128
    assert lab.teaching_row(variant(les, rows[rows["build"] != "fused"])) is None


def test_the_ceilings_come_from_the_provenance_else_the_rows(les):
    assert explain.ceilings_of(les) == {"tbps": gpu_run.TBPS, "tflops": gpu_run.TFLOPS}
    rows = les.results.assign(ceiling_tbps=2.5, ceiling_tflops=300.0)
    bare = lab.Lessons(rows, les.folder, les.device_name, False, {})
    assert explain.ceilings_of(bare) == {"tbps": 2.5, "tflops": 300.0}


def test_the_memory_hierarchy_sets_s_against_the_chip_at_the_measured_bandwidth(les):
    s = B * H * N * N * 2
    sp = 4 * s  # S and P, each written and read back once (N ≤ the softmax's one-pass row)
    shared = 132 * 228 * 1024
    page = lab.memory_hierarchy(variant(les, with_fused_tiles(les), HOPPER)).data
    assert f"S alone is {lab.readable_bytes(s)}: {s / shared:,.0f}× the shared memory of all 132 SMs" in page
    assert "2 GiB: 70×" in page and "(29.4 MiB; NVIDIA" in page and "compute capability 9.0" in page
    assert (f"8 GiB at the measured {gpu_run.TBPS:.3g} TB/s is {sp / (gpu_run.TBPS * 1e9):.3g} ms, of its measured "
            f"{MAT_MS:.3g} ms") in page
    # two consumers of 64 rows: a 128 × 64 Q block (16 KiB) and two stages of 128-key K and V tiles (64 KiB)
    assert "one 128 × 64 Q block and 2 K/V tile pairs of 128 keys on chip (80 KiB of shared memory" in page
    assert f"of its measured {FUSED_MS:.3g} ms" in page
    assert "<svg" in page and "<title>The memory hierarchy" in page and "4 TB/s copy bandwidth, measured" in page
    assert "80 GiB on this card" in page and "S and P at N = 2048: 4 GiB" in page
    bare = lab.memory_hierarchy(les).data  # gpu_run's provenance names no SM count, its rows no tiles
    assert "not recorded for this card" in bare and "records no tiles" in bare and "shared memory of all" not in bare


def test_the_tile_loop_counts_the_tiles_its_row_records(les):
    page = lab.tile_loop(variant(les, with_fused_tiles(les), HOPPER)).data
    tiles, items = N // 128, B * H * (N // 128)
    assert f"128 query rows a work item (64 rows for each of its 2 consumer warpgroups)" in page
    assert f"Each of the B·H·⌈N / 128⌉ = {items:,} work items streams {tiles} K/V tile pairs" in page
    assert "132 programs, one an SM" in page and f"K tile {tiles}" in page and "V tile 1" in page
    assert "of S's 2 GiB, none reaches device memory" in page.replace("&#x27;", "'")
    plain = lab.tile_loop(les).data
    assert "records no tiles" in plain and "K tile last" in plain


def test_the_online_softmax_is_the_softmax_of_the_whole_row():
    steps = lab.online_steps()
    assert [s["m"] for s in steps] == [3.0, 4.0] and math.isnan(steps[0]["rescale"])
    assert steps[1]["rescale"] == pytest.approx(math.exp(-1.0))
    s = np.array([x for t in explain.EXAMPLE_SCORES for x in t])
    v = np.array([x for t in explain.EXAMPLE_VALUES for x in t])
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert steps[-1]["o"] == pytest.approx(float(p @ v), rel=1e-12)
    assert steps[-1]["l"] == pytest.approx(float(np.exp(s - 4.0).sum()))
    page = lab.online_softmax().data
    assert f"| 2 | 4, 2, 2.5 | 3, 0, -1 | 4 | {math.exp(-1):.4f} |" in page and f"= {float(p @ v):.4f}" in page
    # the max in the first tile: nothing to rescale later (factor 1), and still the softmax
    first = lab.online_steps(((5.0, 1.0), (2.0, 0.0)), ((1.0, 2.0), (3.0, 4.0)))
    assert first[1]["rescale"] == 1.0
    s2, v2 = np.array([5.0, 1.0, 2.0, 0.0]), np.array([1.0, 2.0, 3.0, 4.0])
    assert first[-1]["o"] == pytest.approx(float(np.exp(s2 - 5) @ v2 / np.exp(s2 - 5).sum()))


def test_graph_replay_picks_where_eager_calls_part_most_from_the_replay(les):
    rows = les.results.copy()
    fused = rows["build"] == "fused"
    rows.loc[fused, "eager_ms"] = rows.loc[fused, "ms"] + 0.15  # what the host adds to each call
    rows.loc[fused & (rows["D"] == 128), "eager_ms"] -= 0.01  # D = 64 parts most
    text = lab.graph_replay(variant(les, rows)).data
    small = gpu_run.times(512, True)["fused"]  # the smallest time: causal N = 512
    big = gpu_run.times(N, True)["fused"]
    assert text.startswith(f"fused at N = 512 (D = 64, causal, where eager and replay part most): {small:.3g} ms "
                           f"replayed from a graph, {small + 0.15:.3g} ms eager ({(small + 0.15) / small:.2f}× the "
                           "replay), the host 0.15 ms to issue one call")
    assert "waits on Python" in text  # host_ms 0.15 > 0.05
    assert f"At N = 2048: {big:.3g} ms replayed from a graph, {big + 0.15:.3g} ms eager ({(big + 0.15) / big:.2f}×" in text
    assert "no eager time recorded" in lab.graph_replay(les).data  # gpu_run records host_ms only


def test_the_timing_spread_reads_the_teaching_row_and_the_widest_row(les):
    rows = les.results.copy()
    wide = (rows["build"] == "qk_softmax") & (rows["N"] == 1024) & (rows["D"] == 128) & ~rows["causal"].astype(bool)
    rows.loc[wide, "ms_p80"] = rows.loc[wide, "ms"] * 1.3
    text = lab.timing_spread(variant(les, rows)).data
    assert (f"Fused at N = 2048, D = 64 (B = 8, H = 32, bfloat16, non-causal): 10 repetitions, p20 "
            f"{FUSED_MS * 0.99:.4g} ms, median {FUSED_MS:.4g} ms, p80 {FUSED_MS * 1.01:.4g} ms: a spread (p80 − p20) / "
            "median of 2.0%") in text
    assert "Over our three builds' 36 rows the spread is a median 2.0%, at most 31.0% (qk_softmax at N = 1024, D = 128)" \
        in text


def _bench(path, rows):
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path / seeds.BENCH, index=False)


def bench_rows(Hkv, times):
    return [dict(build="fused", B=b, H=32, Hkv=Hkv, N=n, D=64, dtype="bfloat16", causal=False, status="ok", ms=ms)
            for (b, n), ms in zip(((4, 4096), (1, 1024)), times)]


def test_gqa_predicts_from_bytes_and_reads_a_committed_pair_of_benches(les, tmp_path):
    kv_mha, kv_gqa = 2 * B * H * N * D * 2, 2 * B * (H // 4) * N * D * 2
    q_o = 2 * B * H * N * D * 2
    saved = kv_mha - kv_gqa
    _bench(tmp_path / "card" / "gqa", bench_rows(8, [0.98, 0.96]))
    _bench(tmp_path / "card" / "mha", bench_rows(32, [1.0, 1.0]))
    _bench(tmp_path / "other-card" / "mha", bench_rows(32, [2.0, 2.0]))  # another card's: never paired
    page = lab.gqa(les, root=tmp_path).data
    assert (f"G = 4 (Hkv = 8) shrinks K and V from {lab.readable_bytes(kv_mha)} to {lab.readable_bytes(kv_gqa)}, and "
            f"what fused moves from {lab.readable_bytes(q_o + kv_mha)} to {lab.readable_bytes(q_o + kv_gqa)} "
            f"({(q_o + kv_gqa) / (q_o + kv_mha):.1%})") in page
    assert f"saves {saved / (gpu_run.TBPS * 1e9):.3g} ms, {saved / (gpu_run.TBPS * 1e9) / FUSED_MS:.1%} of fused" in page
    assert "every row has Hkv = H" in page
    assert "card/gqa (Hkv &lt; H) and" in page and "card/mha (Hkv = H)" in page and "other-card" not in page
    assert "fused over 2 shapes: its time with GQA over without, median 0.970 (0.960 to 0.980)" in page
    assert "its bytes fell to 62.5%" in page and "<details>" in page and "Measure it on this card" in page
    alone = lab.gqa(les, root=tmp_path / "nothing").data
    assert "Measured in" not in alone and "Measure it on this card" in alone
    # the lesson rows' own pairs come first: fused at Hkv = H / 4, 1 % faster
    rows = les.results
    grouped = rows[rows["build"] == "fused"].assign(Hkv=lambda t: t["H"] // 4, ms=lambda t: t["ms"] * 0.99)
    mine = lab.gqa(variant(les, pd.concat([rows, grouped], ignore_index=True)), root=tmp_path).data
    assert "fused over 12 shapes: its time with GQA over without, median 0.990 (0.990 to 0.990)" in mine
    assert "card/gqa" not in mine


def test_warm_cold_sets_each_first_call_beside_its_warm_time(les):
    rows = les.results.copy()
    first = (rows["N"] == 512) & (rows["D"] == 64) & ~rows["causal"].astype(bool)
    rows["cold_s"] = 0.003
    rows.loc[first, "cold_s"] = 0.2
    rows.loc[first & (rows["build"] == "fused"), "cold_s"] = 0.9
    rows.loc[~first & (rows["build"] == "sdpa_flash"), "cold_s"] = 0.4  # compiles at every shape
    t, at = lab.warm_cold_table(variant(les, rows))
    assert (int(at["N"]), int(at["D"]), bool(at["causal"])) == (512, 64, False)
    assert "fused-no_pv" not in set(t["build"]) and len(t) == 6  # base builds only
    fused = t.set_index("build").loc["fused"]
    ms = gpu_run.times(512, False)["fused"]
    assert fused["first call (ms)"] == pytest.approx(900) and fused["warm median (ms)"] == pytest.approx(ms)
    assert fused["first / warm"] == pytest.approx(900 / ms) and fused["first call at its other shapes, median (ms)"] \
        == pytest.approx(3)
    text, table = lab.warm_cold(variant(les, rows))
    text = text.data
    assert f"({'fused'}: 900 ms against {ms:.3g} ms)" in text
    assert type(table).__name__ == "Folded" and "first call beside its warm median" in table.summary  # detail folded
    assert "our builds' first calls took a median 3 ms: their kernels are compiled once" in text
    assert "the first calls of sdpa_flash still took a median 0.4 s: more than 0.1 s" in text
    rows.loc[~first & (rows["build"] == "torch_eager"), "cold_s"] = 0.8
    both = lab.warm_cold(variant(les, rows))[0].data
    assert "the first calls of torch_eager, sdpa_flash still took a median 0.4 to 0.8 s" in both


def _run(tmp_path, ns, tiles=None, device="cuda:0"):
    """A Run whose gate checked our three builds at each N (D = 64, non-causal) and whose results record `tiles`."""
    gate_rows, results = [], []
    for n in ns:
        for b in ("materialised", "qk_softmax", "fused"):
            gate_rows.append(dict(B=1, H=2, Hkv=2, N=n, D=64, dtype="bfloat16", causal=False, build=b, shape=0,
                                  status="ok", err=0.005 if n == ns[0] else 0.002, limit=0.01, err_lowp=0.005,
                                  unwritten=0))
            if tiles:
                kernels = {"materialised": ("scores", "pv"), "qk_softmax": ("qk_softmax", "pv"), "fused": ("fused",)}
                results.append(dict(build=b, N=n, D=64, dtype="bfloat16", causal=False,
                                    tiles=json.dumps({k: tiles for k in kernels[b]})))
    return lab.Run(tmp_path, {"dtype": "bfloat16"}, device, {}, pd.DataFrame(results), pd.DataFrame(gate_rows))


def test_ragged_names_the_gates_partial_tiles_and_how_they_fared(tmp_path):
    run = _run(tmp_path, [100, 256], tiles={"BLOCK_M": 64, "BLOCK_N": 128})
    t = lab.ragged_table(run).set_index("N")
    assert bool(t.loc[100, "ragged"]) and not bool(t.loc[256, "ragged"]) and t.loc[100, "tiles"] == "64 × 128"
    text = lab.ragged(run).data
    assert text.startswith("The gate checked N = 100, 256.")
    assert "Ragged here: N = 100 (tiles 64 × 128): 3 of 3 checks passed, worst err / limit 0.50." in text
    whole = lab.ragged(_run(tmp_path, [256, 512], tiles={"BLOCK_M": 64, "BLOCK_N": 128})).data
    on_gpu = sorted({c.N for c in gate.grid(torch.device("cuda")) if c.N % 128})
    assert 1001 in on_gpu and f"N = {', '.join(map(str, on_gpu))} on a GPU" in whole
    assert whole.startswith("The gate checked N = 256, 512: each a whole number of every tile")
    assert "`attnlab check --ns 1001,2999`" in whole


def test_ragged_asks_the_launcher_for_tiles_the_rows_do_not_record(tmp_path):
    """Before the sweep (no rows yet) the tiles are the launcher's for the run's device: under Triton's interpreter
    one 128 × 128 tile, so N = 64 runs half-empty."""
    text = lab.ragged(_run(tmp_path, [64, 128], device="cpu")).data
    assert "Ragged here: N = 64 (tiles 128 × 128): 3 of 3 checks passed" in text and "N = 128 (" not in text


def test_ragged_says_nothing_where_no_tiles_are_known(tmp_path):
    """A GPU run read on a machine without its GPU, whose rows record no tiles: nothing to judge N against."""
    text = lab.ragged(_run(tmp_path, [100], device="cuda:0")).data
    assert text.startswith("Neither the gate's rows nor the run's record which tiles")
