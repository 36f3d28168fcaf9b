"""The autotune sweep's choice (attnlab.autotune.pick) and its candidate lists; the GPU timing itself runs on the
device (`attnlab bench --autotune`)."""
import json
import math

import pandas as pd
import pytest

from attnlab import autotune, bench
from attnlab.triton import config, plan
from attnlab.triton.resources import label, parse_tiles


def frame(times: dict, kernel="fused", D=128, causal=False):
    """A results frame from {label: [ms at each N]} at N = 1024, 4096, 16384."""
    ns = (1024, 4096, 16384)
    return pd.DataFrame([dict(kernel=kernel, D=D, causal=causal, N=n, tiles=parse_tiles(lab), ms=ms)
                         for lab, row in times.items() for n, ms in zip(ns, row)])


def test_the_winner_is_best_over_all_n_not_at_one():
    """A candidate best at one N but far behind at the others loses to one a little behind everywhere."""
    entries = autotune.pick(frame({"128x64w8s3": [1.00, 4.00, 16.0],   # best at N = 1024 only
                                   "128x64w4s3": [1.02, 3.30, 13.0],   # 2 % behind, then best
                                   "64x64w4s3": [1.50, 3.40, 13.1]}), "sm90", 2)
    assert len(entries) == 1
    e = entries[0]
    assert config.Tiles(**e["tiles"]) == parse_tiles("128x64w4s3")
    assert e["D"] == 128 and e["causal"] is False and e["family"] == "sm90" and e["itemsize"] == 2
    assert e["score"] == pytest.approx((1.02 / 1.00) ** (1 / 3))
    assert e["ms"] == {1024: 1.02, 4096: 3.30, 16384: 13.0}


def test_a_candidate_that_failed_at_any_n_is_out():
    entries = autotune.pick(frame({"128x128w8s3": [0.9, 3.0, math.inf],  # fastest where it ran, failed at 16384
                                   "128x64w8s3": [1.0, 3.3, 13.0]}), "sm90", 2)
    assert [config.Tiles(**e["tiles"]) for e in entries] == [parse_tiles("128x64w8s3")]


def test_a_gluon_winner_brings_the_best_triton_entry_for_the_rest_of_the_bucket():
    """The Gluon kernel compiles for D = 128 exactly ("=128"); D = 65…127 need the best Triton configuration."""
    entries = autotune.pick(frame({"64x128w4s2gmc": [0.8, 3.0, 12.0], "128x64w8s3p": [1.0, 3.5, 14.0],
                                   "128x64w8s3": [1.1, 3.6, 14.2]}), "sm90", 2)
    assert [(e["D"], config.Tiles(**e["tiles"])) for e in entries] == [
        ("=128", parse_tiles("64x128w4s2gmc")), (128, parse_tiles("128x64w8s3p"))]


def test_each_kernel_d_and_causal_gets_its_own_entries_and_they_load_as_overrides(tmp_path):
    r = pd.concat([frame({"128x64w8s3": [1, 2, 3], "64x64w4s3": [2, 3, 4]}, D=64, causal=c) for c in (False, True)]
                  + [frame({"128x64w4s3": [1, 2, 3], "64x64w4s3": [0.5, 1, 2]}, kernel="pv", D=128)])
    entries = autotune.pick(r, "interpreter", 4)
    assert [(e["kernel"], e["D"], e["causal"]) for e in entries] == [("fused", 64, False), ("fused", 64, True),
                                                                     ("pv", 128, False)]
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps([{k: v for k, v in e.items() if k not in ("score", "ms")} for e in entries]))
    with plan.overriding(plan.read_overrides(str(path))):
        assert plan.lookup("pv", "interpreter", 128, False, 4) == parse_tiles("64x64w4s3")
        assert plan.lookup("fused", "interpreter", 64, True, 4) == parse_tiles("128x64w8s3")
    assert plan.lookup("pv", "interpreter", 128, False, 4) != parse_tiles("64x64w4s3")


def test_candidate_lists_hold_the_tiles_the_rules_chose():
    """The sweep can only re-choose the rules' tiles if every sm90 choice of a tuned kernel (at D = 64 and 128, short
    and long N, one wave or not) is among its candidates."""
    for kernel in ("fused", "qk_softmax", "pv"):
        cands = autotune.candidates(kernel)
        for D in (64, 128):
            for causal in (False, True):
                for N, heads in ((None, None), (512, 64), (723, 64), (1024, 1), (1447, 64), (2048, 64), (8192, 64)):
                    for gluon in (True, False):
                        t = plan.lookup(kernel, "sm90", D, causal, 2, gluon, N, heads, 132)
                        assert t in cands or (not causal and t.heavy_first), (kernel, D, causal, N, t)


def test_bad_autotune_arguments_get_one_clear_error(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert bench.main(["--autotune", "--candidates", "128by64"]) == 2
    assert "--candidates" in capsys.readouterr().err
    assert bench.main(["--autotune", "--tune-ns", "1024,x"]) == 2
    assert bench.main(["--autotune", "--kernels", "fused,scores"]) == 2
    assert "argument --kernels: expected kernels from fused, qk_softmax, pv" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kernel must be one of"):
        autotune.candidates("scores")


def _gpu_stand_ins(monkeypatch, time_case, accurate):
    """autotune.run's GPU parts stood in for: measure.time_case by `time_case`, the oracle check by `accurate(o)` on the
    timed call's output, inputs as zeros, no spin-up, an sm90 family."""
    import torch

    from attnlab import measure
    from attnlab.accuracy import Verdict

    monkeypatch.setattr(measure, "time_case", time_case)
    monkeypatch.setattr(measure, "oracle_check", lambda name, o, *a: Verdict(0.0, 0.0, 1.0, accurate(o)))
    monkeypatch.setattr(measure, "spin_up", lambda *a: None)
    monkeypatch.setattr(measure, "make_inputs", lambda case: [torch.zeros(1, 1, case.N, case.D)] * 3)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(config, "family", lambda dev: "sm90")


def test_the_sweep_loop_records_failures_and_writes_every_candidate(tmp_path, monkeypatch):
    """run() with the GPU parts stood in for: a candidate that errors, one that is inaccurate and one that is
    slower at one N each end as rows (inf for the first two), the csv holds every (candidate, N), the winner is the
    one that ran and was right everywhere, and the one faster at N = 512 only gets a short-N entry."""
    import torch

    good, slow, broken, wrong = (parse_tiles(x) for x in ("128x64w8s3", "64x64w4s3", "128x128w8s3", "64x32w4s2"))

    def time_case(build, q, k, v, causal):
        t = plan.lookup("fused", config.family(q.device), q.shape[-1], causal, q.dtype.itemsize)
        if t == broken:
            return dict(status="error: out of shared memory", ms=float("nan"), o=None)
        return dict(status="ok", ms={good: 1.0, slow: 0.9 if q.shape[2] == 512 else 2.0}.get(t, 0.5), o=t)

    _gpu_stand_ins(monkeypatch, time_case, accurate=lambda o: o != wrong)
    entries = autotune.run(["fused"], torch.bfloat16, [512, 2048], str(tmp_path), only=[good, slow, broken, wrong])
    csv = pd.read_csv(tmp_path / "autotune.csv")
    assert len(csv) == 4 * 2 * 2 * 2  # candidates × N × D × causal
    assert set(csv[csv.label == "128x128w8s3"].status) == {"error: out of shared memory"}
    assert set(csv[csv.label == "64x32w4s2"].status) == {"inaccurate"}
    assert (csv[csv.status != "ok"].ms == math.inf).all()
    assert [config.Tiles(**e["tiles"]) for e in entries if not e.get("short")] == [good] * 4
    # 10 % faster than the winner at N = 512, slower at 2048: a short-N entry for each key, below their middle
    assert [config.Tiles(**e["tiles"]) for e in entries if e.get("short")] == [slow] * 4
    written = json.loads((tmp_path / "tiles.json").read_text())
    assert written[0]["tiles"] == good.as_dict() and "short" not in written[0]
    assert written[1] == dict(kernel="fused", family="sm90", D=64, causal=False, itemsize=2, tiles=slow.as_dict(),
                              short=True, below=1024)


def test_each_case_times_the_candidates_in_a_turned_order(tmp_path, monkeypatch):
    """No candidate is always timed first or last (the card's clock drifts under its power cap within a case): case i
    starts at candidate i mod len, every candidate is timed once a case, and over as many cases as candidates each
    one holds each place once."""
    import torch

    cands = [parse_tiles(x) for x in ("128x64w8s3", "64x64w4s3", "128x128w8s3")]
    order = []

    def time_case(build, q, k, v, causal):
        order.append(plan.lookup("fused", config.family(q.device), q.shape[-1], causal, q.dtype.itemsize))
        return dict(status="ok", ms=1.0, o=None)

    _gpu_stand_ins(monkeypatch, time_case, accurate=lambda o: True)
    autotune.run(["fused"], torch.bfloat16, [512, 1024, 2048], str(tmp_path), only=cands)
    cases = [order[i:i + 3] for i in range(0, len(order), 3)]
    assert len(cases) == 2 * 2 * 3  # D × causal × N
    assert all(sorted(map(str, c)) == sorted(map(str, cands)) for c in cases)
    assert [c[0] for c in cases[:3]] == cands  # case i starts at candidate i mod 3
    assert all({str(c[place]) for c in cases[:3]} == set(map(str, cands)) for place in range(3))
    assert [autotune.rotated(cands, 4)[0], autotune.rotated([], 2)] == [cands[1], []]


def test_the_table_entry_stays_unless_beaten_by_more_than_noise():
    """Scores within TIE of the best are noise: the incumbent (the table's entry now) stays; beaten by more, it goes.
    Under a Gluon winner the Triton entry follows the same rule with the table's Triton incumbent."""
    times = {"128x64w8s3": [1.000, 4.00, 16.0], "128x64w4s3": [1.005, 4.01, 16.1], "64x64w4s3": [1.2, 4.8, 19.0]}
    r = frame(times)
    keep = autotune.pick(r, "sm90", 2, lambda kernel, D, causal, gluon, n: parse_tiles("128x64w4s3"))
    assert [config.Tiles(**e["tiles"]) for e in keep] == [parse_tiles("128x64w4s3")]  # 0.4 % behind: stays
    go = autotune.pick(r, "sm90", 2, lambda kernel, D, causal, gluon, n: parse_tiles("64x64w4s3"))
    assert [config.Tiles(**e["tiles"]) for e in go] == [parse_tiles("128x64w8s3")]  # 20 % behind: replaced
    gone = autotune.pick(r, "sm90", 2, lambda kernel, D, causal, gluon, n: parse_tiles("32x32w4s2"))  # not a candidate
    assert [config.Tiles(**e["tiles"]) for e in gone] == [parse_tiles("128x64w8s3")]
    with_gluon = frame({"64x128w4s2gmc": [0.8, 3.0, 12.0], **times})
    now = {True: parse_tiles("64x128w4s2gmc"), False: parse_tiles("128x64w4s3")}
    entries = autotune.pick(with_gluon, "sm90", 2, lambda kernel, D, causal, gluon, n: now[gluon])
    assert [(e["D"], config.Tiles(**e["tiles"])) for e in entries] == [("=128", now[True]), (128, now[False])]


@pytest.mark.parametrize("behind, stays", [(1.009, True), (1.011, False)], ids=["0.9 %", "1.1 %"])
def test_the_incumbent_stays_within_tie_of_the_best_score_and_goes_beyond_it(behind, stays):
    best, incumbent = "128x64w8s3", "128x64w4s3"
    r = frame({best: [1.0, 4.0, 16.0], incumbent: [1.0 * behind, 4.0 * behind, 16.0 * behind]})
    entries = autotune.pick(r, "sm90", 2, lambda *a: parse_tiles(incumbent))
    assert [config.Tiles(**e["tiles"]) for e in entries] == [parse_tiles(incumbent if stays else best)]


@pytest.mark.parametrize("slower, stays", [(1.009, False), (1.011, True)], ids=["0.9 %", "1.1 %"])
def test_a_better_score_slower_at_the_longest_n_by_more_than_tie_leaves_the_incumbent(slower, stays):
    challenger, incumbent = "128x64w8s3", "128x64w4s3"
    r = frame({challenger: [1.0, 4.0, 16.0 * slower], incumbent: [1.04, 4.16, 16.0]})  # 4 %: no short entry
    entries = autotune.pick(r, "sm90", 2, lambda *a: parse_tiles(incumbent))
    assert [config.Tiles(**e["tiles"]) for e in entries] == [parse_tiles(incumbent if stays else challenger)]


def test_a_challenger_that_wins_the_score_at_short_n_only_goes_to_short():
    """A case the sweep met: a candidate 9 % faster at N = 1024 but 4 % slower at the sweep's longest N would win the
    geometric-mean score; the incumbent keeps the table and the challenger serves the short N as a SHORT entry.
    Faster or within TIE at the longest N, it takes the table."""
    def picks(at_longest):
        times = {"64x128w4s3hg": [0.428, 0.715, 2.429], "64x128w4s2hgu": [0.390, 0.686, at_longest]}
        return [(label(config.Tiles(**e["tiles"])), e.get("below")) for e in autotune.pick(
            short_frame(times, ns=(1024, 2048, 8192)), "sm90", 2,
            lambda kernel, D, causal, gluon, n: parse_tiles("64x128w4s3hg"))]

    assert picks(2.523) == [("64x128w4s3hg", None), ("64x128w4s2hgu", 1448)]
    assert picks(2.440) == [("64x128w4s2hgu", None)]  # 0.5 % slower there: noise, and the score wins


def short_frame(times: dict, D=128, causal=True, ns=(512, 2048, 8192)):
    """A results frame from {label: [ms at each N of ns]} (default: the sweep's default N)."""
    return pd.DataFrame([dict(kernel="fused", D=D, causal=causal, N=n, tiles=parse_tiles(lab), ms=ms)
                         for lab, row in times.items() for n, ms in zip(ns, row)])


def test_the_winner_is_scored_from_short_n_up_and_a_short_entry_needs_a_clear_gain():
    """The key's entry is scored at N ≥ SHORT_N only; below it another candidate gets a short entry only when it
    beats that entry there by more than SHORT_GAIN, and a short entry keeps its place on noise as the main one."""
    long_best, short_best = "64x128w4s2hgmco", "64x64w4s2hgmcou"
    entries = autotune.pick(short_frame({long_best: [0.134, 0.274, 0.931], short_best: [0.110, 0.321, 1.12],
                                         "64x64w4s3h": [0.145, 0.365, 1.22]}), "sm90", 2)
    assert [(e["D"], label(config.Tiles(**e["tiles"])), e.get("short", False)) for e in entries] == [
        ("=128", long_best, False), (128, "64x64w4s3h", False), ("=128", short_best, True)]
    assert entries[-1]["score"] == pytest.approx(1.0) and entries[-1]["ms"][512] == 0.110
    assert entries[-1]["below"] == 1024  # it lost at 2048: below the middle of 512 and 2048
    # 4 % at N = 512 is within SHORT_GAIN: no short entry
    close = autotune.pick(short_frame({long_best: [0.114, 0.274, 0.931], short_best: [0.110, 0.321, 1.12]}),
                          "sm90", 2)
    assert not [e for e in close if e.get("short")]
    # a short incumbent within TIE of the fastest at N = 512 stays
    third = "64x64w4s2hgmu"
    kept = autotune.pick(short_frame({long_best: [0.134, 0.274, 0.931], short_best: [0.110, 0.321, 1.12],
                                      third: [0.1105, 0.33, 1.2]}), "sm90", 2,
                         lambda kernel, D, causal, gluon, n: parse_tiles(third if n else long_best))
    assert label(config.Tiles(**[e for e in kept if e.get("short")][0]["tiles"])) == third


def test_a_short_entry_serves_up_to_the_last_n_it_wins_at_clearly():
    """A case the sweep met (D = 64 causal): one candidate wins by more than SHORT_GAIN at 512 and 1024 but by 1 % at
    2048, where the key's winner is chosen too: its entry serves below the middle of 1024 and 2048. One that wins
    clearly at 512 only (D = 128: a tie at 1024) serves below the middle of 512 and 1024. The short entry is the best
    over the N it serves, not at the smallest alone; and the largest N is the winner's alone."""
    ns = (512, 1024, 2048, 8192)
    main, wide, narrow = "64x128w4s2hgmco", "64x128w4s2hgmcou", "64x64w4s2hgmcou"
    d64 = autotune.pick(short_frame({main: [0.2001, 0.2455, 0.3847, 1.2930], wide: [0.1476, 0.2248, 0.3806, 1.45],
                                     narrow: [0.1473, 0.2329, 0.4036, 1.4460]}, D=64, ns=ns), "sm90", 2)
    short = [e for e in d64 if e.get("short")]
    assert [(label(config.Tiles(**e["tiles"])), e["below"]) for e in short] == [(wide, 1448)]
    d128 = autotune.pick(short_frame({main: [0.1359, 0.1758, 0.2721, 0.9121], narrow: [0.1102, 0.1755, 0.3123, 1.125]},
                                     ns=ns), "sm90", 2)
    assert [(label(config.Tiles(**e["tiles"])), e["below"]) for e in d128 if e.get("short")] == [(narrow, 724)]
    # winning at every N but the largest: still bounded there (the middle of 2048 and 8192)
    all_but = autotune.pick(short_frame({main: [0.2, 0.3, 0.4, 1.0], wide: [0.1, 0.2, 0.3, 2.0]}, D=64, ns=ns),
                            "sm90", 2)
    assert [e["below"] for e in all_but if e.get("short")] == [4096]


def test_short_entries_serve_below_their_bound_are_forced_away_and_follow_an_override_file(tmp_path, monkeypatch):
    """plan.lookup takes the short causal tiles below their bound and the long ones from it (and without N);
    plan.forced replaces both for its kernel; an autotune file's entries replace the rules for the keys it tunes,
    each short one below its own bound (SHORT_N for a file written before bounds)."""
    monkeypatch.setattr(config, "gluon_verified", lambda: True)
    long_t = plan.lookup("fused", "sm90", 128, True, 2)
    below = plan.FUSED_ONE_CONSUMER_BELOW[128]
    short_t = plan.lookup("fused", "sm90", 128, True, 2, N=below - 1)
    assert long_t != short_t and short_t.one_consumer and long_t.persistent
    assert plan.lookup("fused", "sm90", 128, True, 2, N=below - 1) == short_t
    assert plan.lookup("fused", "sm90", 128, True, 2, N=below) == long_t
    assert plan.lookup("fused", "sm90", 96, True, 2, N=512) == plan.lookup("fused", "sm90", 96, True, 2)  # Triton
    assert plan.lookup("fused", "sm90", 128, True, 2, gluon=False, N=512) == plan.lookup(
        "fused", "sm90", 128, True, 2, gluon=False)
    forced = parse_tiles("64x64w4s3")
    with plan.forced("fused", forced):
        assert plan.lookup("fused", "sm90", 128, True, 2, N=512) == forced
    assert plan.lookup("fused", "sm90", 128, True, 2, N=512) == short_t
    entry = dict(kernel="fused", family="sm90", D="=128", causal=True, itemsize=2)
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps([dict(entry, tiles=parse_tiles("64x128w4s2hgm").as_dict())]))
    qk = plan.lookup("qk_softmax", "sm90", 128, True, 2, N=512)
    with plan.overriding(plan.read_overrides(str(path))):
        # the file tunes fused's key and has no short entry: its tiles at every N; the kernels it does not tune keep
        # the rules'
        assert plan.lookup("fused", "sm90", 128, True, 2, N=512) == parse_tiles("64x128w4s2hgm")
        assert plan.lookup("qk_softmax", "sm90", 128, True, 2, N=512) == qk
    path.write_text(json.dumps([dict(entry, tiles=parse_tiles("64x128w4s2hgm").as_dict()),
                                dict(entry, tiles=parse_tiles("64x64w4s2hgmu").as_dict(), short=True)]))
    with plan.overriding(plan.read_overrides(str(path))):
        assert plan.lookup("fused", "sm90", 128, True, 2, N=512) == parse_tiles("64x64w4s2hgmu")
        assert plan.lookup("fused", "sm90", 128, True, 2, N=plan.SHORT_N - 1) == parse_tiles("64x64w4s2hgmu")
        assert plan.lookup("fused", "sm90", 128, True, 2, N=plan.SHORT_N) == parse_tiles("64x128w4s2hgm")
    path.write_text(json.dumps([dict(entry, tiles=parse_tiles("64x128w4s2hgm").as_dict()),
                                dict(entry, tiles=parse_tiles("64x64w4s2hgmu").as_dict(), short=True, below=1448)]))
    with plan.overriding(plan.read_overrides(str(path))):
        assert plan.lookup("fused", "sm90", 128, True, 2, N=1447) == parse_tiles("64x64w4s2hgmu")
        assert plan.lookup("fused", "sm90", 128, True, 2, N=1448) == parse_tiles("64x128w4s2hgm")


def test_a_one_pass_candidate_competes_for_the_short_entry_alone_and_serves_only_where_its_row_fits():
    """A one-pass candidate (Tiles.one_pass) runs its own kernel only up to qk_softmax_row.ROW_MAX
    and the two-pass kernel beyond, so it never takes a key's table entry, even when it is fastest at every N (its
    times past ROW_MAX are another kernel's); it takes the short entry where it beats the winner clearly, below
    ROW_MAX + 1 at most (the geometric middle of 1024 and 2048, 1448, would send N = 1032 to a two-pass kernel the
    sweep never timed there)."""
    from attnlab.triton.hopper.qk_softmax_row import ROW_MAX

    def chosen(times):  # (label, below) of each entry pick makes from these times, the table's 64x128w4s3g incumbent
        entries = autotune.pick(short_frame(times, ns=(512, 1024, 2048, 8192)), "sm90", 2,
                                lambda kernel, D, causal, gluon, n: parse_tiles("64x128w4s3g"))
        return [(label(config.Tiles(**e["tiles"])), e.get("below")) for e in entries]

    times = {"64x128w4s3g": [0.4848, 0.8717, 1.6280, 6.2386], "64x128w4s4ga": [0.4252, 0.8186, 1.6004, 6.1253]}
    assert chosen(times) == [("64x128w4s3g", None), ("64x128w4s4ga", ROW_MAX + 1)]
    # a two-pass candidate with those times takes the table instead (fastest at every N: no short entry)
    times["64x128w4s4g"] = times.pop("64x128w4s4ga")
    assert chosen(times) == [("64x128w4s4g", None)]
