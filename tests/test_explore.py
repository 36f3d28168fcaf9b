"""The shape explorer (attnlab.explore) driven as a notebook user drives it, without a browser: setting a control's
value fires its observers (ipywidgets, outside a kernel, gives each widget a dummy comm)."""
import math

import pytest

from attnlab import explore
from attnlab.builds import Unsupported
from attnlab.measure import Case
from tests.test_compare import MS, REPO, execute, outputs, write_run

OURS = ("materialised", "qk_softmax", "fused")


class FakeGPU:
    """In place of a live measurement: records every case it is asked for; ms = MS[build]·(N/512)², peak = 3·N²."""

    def __init__(self, refuse=()):
        self.cases = []
        self.refuse = refuse

    def __call__(self, case):
        self.cases.append(case)
        if case.build in self.refuse:
            raise Unsupported(f"{case.build} has no kernel for D={case.D} here")
        return dict(status="ok", message="", ms=MS[case.build] * (case.N / 512) ** 2, reps=10, timer="fake",
                    peak_bytes=3.0 * case.N ** 2, err=1e-3, err_limit=1e-2, passed=True)


def live(gpu=None, free=1 << 40, **values):
    gpu = gpu or FakeGPU()
    ex = explore.Explorer("cuda:0", measure=gpu, free_bytes=lambda: free, reference=None,
                          **{"builds": OURS, "N": 1024, **values})
    return ex, gpu


def trace(fig, name, axis="x"):
    found = [t for t in fig.data if t.name == name and t.xaxis == axis]
    assert len(found) == 1, [(t.name, t.xaxis) for t in fig.data]
    return found[0]


def test_moving_the_n_slider_measures_the_new_n_and_updates_the_figure_in_place():
    ex, gpu = live()
    fig = ex.figure
    assert list(trace(fig, "fused").x) == [1024] and len(gpu.cases) == 3
    ex.controls["N"].value = 2048
    assert ex.figure is fig  # the same widget, new data
    fused = trace(fig, "fused")
    assert list(fused.x) == [1024, 2048] and list(fused.y) == pytest.approx([4.0, 16.0])
    assert list(fused.marker.size) == [6, 12]  # the current N stands out
    assert [c.N for c in gpu.cases] == [1024] * 3 + [2048] * 3  # only the new N was measured
    assert "2048" in fig.layout.title.text
    tflops = trace(fig, "fused", "x3")  # model FLOPs / measured time: 4·B·H·N²·D / ms
    assert tflops.y[1] == pytest.approx(4 * 4 * 16 * 2048 ** 2 * 64 / (16.0 * 1e9))


def test_going_back_and_changing_a_dropdown_measure_only_what_is_new():
    ex, gpu = live()
    ex.controls["N"].value = 2048
    ex.controls["N"].value = 1024  # back: everything is in the cache
    assert len(gpu.cases) == 6 and ex.status.value.startswith("0 case(s) measured now, 3 kept")
    ex.controls["D"].value = 128
    assert len(gpu.cases) == 9 and {c.D for c in gpu.cases[6:]} == {128}
    assert list(trace(ex.figure, "materialised").x) == [1024]  # D = 128 has one N so far
    ex.controls["D"].value = 64
    assert len(gpu.cases) == 9 and list(trace(ex.figure, "materialised").x) == [1024, 2048]
    ex.controls["builds"].value = (*OURS, "sdpa_flash")
    assert [c.build for c in gpu.cases[9:]] == ["sdpa_flash"]
    assert ex.progress.max == 1 and ex.progress.value == 1  # the progress bar counted the one new case
    assert trace(ex.figure, "sdpa_flash").y[0] == pytest.approx(0.8 * 4)


def test_a_shape_too_large_for_free_memory_is_refused_with_a_message_and_not_run():
    ex, gpu = live(free=4 << 30, N=1024)
    ex.controls["N"].value = 65536
    built = [c.build for c in gpu.cases if c.N == 65536]
    assert built == ["fused"]  # 2 GiB: q, k, v, O; qk_softmax also holds P, 4·16·65536²·2 B = 512 GiB
    text = ex.messages.value
    assert "materialised is not run at B=4 H=16 N=65536" in text and "more than the 4.00 GiB free" in text
    assert "qk_softmax is not run" in text and "Traceback" not in text
    table = ex.table_frame()
    assert table.set_index("build").loc["materialised", "passes"] == "too big"


def test_a_shape_validate_refuses_gets_its_message_and_an_empty_figure():
    ex, gpu = live()
    ex.controls["Hkv"].value = 3
    assert "q heads H=16 must be a multiple of k/v heads Hkv=3" in ex.messages.value
    assert "no figure" in ex.figure.layout.title.text
    assert [t.xaxis for t in ex.figure.data] == ["x", "x2", "x3"] and all(len(t.x) == 0 for t in ex.figure.data)
    assert len(gpu.cases) == 3  # nothing ran for it
    ex.controls["Hkv"].value = 4  # grouped-query attention: accepted and measured
    assert len(gpu.cases) == 6 and {c.Hkv for c in gpu.cases[3:]} == {4}


def test_an_unsupported_build_is_refused_with_a_message_live():
    ex, gpu = live(FakeGPU(refuse=("qk_softmax",)))
    assert "qk_softmax is unsupported at B=4 H=16 N=1024" in ex.messages.value
    assert "has no kernel for D=64 here" in ex.messages.value
    assert {t.name for t in ex.figure.data if t.xaxis == "x"} == {"materialised", "fused"}
    ex.controls["N"].value = 2048
    ex.controls["N"].value = 1024
    assert [c.build for c in gpu.cases].count("qk_softmax") == 2  # refusals are kept too: asked once per shape


def test_every_panel_has_a_title_and_axis_labels_with_units():
    for ex in (live()[0], explore.Explorer("cpu", reference=None, check=False)):
        layout = ex.figure.layout
        assert len(layout.annotations) == 3 and all(a.text for a in layout.annotations)
        for i in ("", "2", "3"):
            assert layout[f"xaxis{i}"].title.text == "sequence length N (tokens)"
            y = layout[f"yaxis{i}"].title.text
            assert any(unit in y for unit in ("ms", "bytes", "TFLOP/s")), y
        assert layout.title.text


@pytest.fixture
def reference(tmp_path):
    return write_run(tmp_path / "outputs" / "h200" / "grid", dims=(64, 128), ns=(512, 1024, 2048))


def test_without_a_gpu_every_number_says_where_it_comes_from_and_none_is_an_interpreter_time(reference):
    ex = explore.Explorer("cpu", reference=reference, builds=("fused", "sdpa_cudnn"), N=2048, D=128, B=2, H=8,
                          Hkv=8, causal=True)
    assert ex.mode == "teach" and "nothing is timed" in ex.banner.value
    assert [a.text for a in ex.figure.layout.annotations] == [
        "bytes each build moves (model)", "bytes each build holds at once (model)",
        "committed GPU run (not this machine)"]
    assert {t.name for t in ex.figure.data} >= {"fused (model)", "fused (NVIDIA H200, committed)"}
    committed = trace(ex.figure, "fused (NVIDIA H200, committed)", "x3")
    # the committed causal D = 128 fused rows: 1 ms · (N/512)² · ½
    assert list(committed.x) == [512, 1024, 2048] and list(committed.y) == pytest.approx([0.5, 2.0, 8.0])
    moved = trace(ex.figure, "fused (model)")
    at = list(moved.x).index(2048)
    assert moved.y[at] == 4 * 2 * 8 * 2048 * 128 * 2  # Q, K, V read and O written once, bf16
    # the interpreter checks correctness at a small shape and never reports its time
    assert [c.N for c in ex.measured] == [64, 64] and {c.B for c in ex.measured} == {1}
    table = ex.table_frame().set_index("build")
    assert table.loc["fused", "passes"] == "yes"
    assert table.loc["fused", "error vs fp64 (interpreter, small shape)"] <= table.loc["fused", "limit"]
    assert table.loc["fused", "NVIDIA H200 ms (committed)"] == pytest.approx(8.0)
    assert table.loc["fused", "committed at"] == "B 8 (yours 2), H 16 (yours 8), Hkv 16 (yours 8)"
    assert not [c for c in table.columns if "ms" in c and "committed" not in c]
    text = ex.messages.value
    assert "sdpa_cudnn is unsupported at B=1 H=2 N=64 D=128" in text  # torch has no cuDNN kernel on a CPU
    assert "in Triton&#x27;s interpreter on this CPU" in text and "not shown" in text
    ex.controls["N"].value = 4096  # the small case is the same: nothing new to check
    assert len(ex.measured) == 2


def test_the_teach_view_names_builds_that_would_not_fit_the_committed_card(reference):
    ex = explore.Explorer("cpu", reference=reference, check=False, builds=OURS, N=131072, B=4, H=16, Hkv=16)
    text = ex.messages.value
    assert "materialised would need" in text and "NVIDIA H200; it could not run there" in text
    assert "fused would need" not in text


def test_the_static_view_moves_over_the_committed_groups(reference):
    fig = explore.static_view(reference, names=("materialised", "fused"))
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["bfloat16 D=64 non-causal", "bfloat16 D=64 causal",
                                        "bfloat16 D=128 non-causal", "bfloat16 D=128 causal"]
    for s in steps:
        shown = [t for t, v in zip(fig.data, s.args[0]["visible"]) if v]
        assert {t.name for t in shown} == {"materialised", "fused", "materialised must hold (model)",
                                          "fused must hold (model)"}
    causal64 = [t for t, v in zip(fig.data, steps[1].args[0]["visible"]) if v and t.name == "fused"][0]
    assert list(causal64.y) == pytest.approx([0.5, 2.0, 8.0])
    assert [t.visible for t in fig.data].count(True) == 6  # the first step's traces, before any move
    assert fig.layout.title.text and fig.layout.xaxis.title.text == "sequence length N (tokens)"
    assert "ms" in fig.layout.yaxis.title.text and "bytes" in fig.layout.yaxis2.title.text


def test_without_a_committed_run_the_static_view_moves_over_the_model():
    fig = explore.static_view(None, names=("fused",))
    steps = fig.layout.sliders[0].steps
    assert len(steps) == 2 * len(explore.D_OPTIONS) and "model" in fig.layout.title.text
    first = [t for t, v in zip(fig.data, steps[0].args[0]["visible"]) if v][0]
    assert first.y[0] == 4 * 4 * 16 * 64 * 16 * 2  # fused at B=4 H=16 N=64 D=16 bf16: Q, K, V and O once
    assert "bytes" in fig.layout.yaxis.title.text and "bytes" in fig.layout.yaxis2.title.text


def test_the_live_measurement_runs_each_step_and_checks_the_output():
    # on a CPU only to prove the steps run together (its time is perf_counter's and never shown by the explorer)
    r = explore.measure_live(Case("torch_eager", 1, 2, 2, 32, 16, "float32", True, "cpu"), reps_ms=1.0)
    assert r["status"] == "ok" and r["reps"] >= 3 and r["timer"] == "perf_counter, eager back to back"
    assert r["passed"] and r["err"] <= r["err_limit"]
    assert math.isnan(r["peak_bytes"])  # a CPU has no allocator statistics
    with pytest.raises(Unsupported):  # the explorer turns this into a line in the page
        explore.measure_live(Case("sdpa_cudnn", 1, 2, 2, 32, 16, "float32", False, "cpu"), reps_ms=1.0)


def test_explore_shapes_runs_top_to_bottom_and_keeps_a_moving_view_for_exports(reference, tmp_path, monkeypatch):
    nb = execute(REPO / "notebooks" / "explore_shapes.ipynb", tmp_path / "out.ipynb", {"reference": str(reference)},
                 monkeypatch)
    assert not outputs(nb, "error")
    assert [o for o in outputs(nb) if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    static = [o["data"]["application/vnd.plotly.v1+json"] for o in outputs(nb)
              if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(static) == 1 and len(static[0]["layout"]["sliders"][0]["steps"]) == 4
    assert "grid on NVIDIA H200" in static[0]["layout"]["title"]["text"]


def test_every_byte_axis_reads_in_binary_units_and_spans_what_it_shows(reference):
    from attnlab.report.units import byte_label

    for ex, panels in ((live()[0], ("2",)), (explore.Explorer("cpu", reference=reference, check=False), ("", "2"))):
        for i in panels:
            axis = ex.figure.layout[f"yaxis{i}"]
            shown = [y for t in ex.figure.data if t.yaxis == f"y{i}" for y in t.y]
            assert axis.tickmode == "array" and list(axis.ticktext) == [byte_label(v) for v in axis.tickvals]
            assert min(axis.tickvals) <= min(shown) and max(axis.tickvals) >= max(shown)
            assert all(t.customdata and t.hovertemplate for t in ex.figure.data if t.yaxis == f"y{i}")
        ex.controls["N"].value = 65536  # larger shapes: the ticks follow the values
        shown = [y for t in ex.figure.data if t.yaxis == "y2" for y in t.y]
        assert max(ex.figure.layout.yaxis2.tickvals) >= max(shown)
    for fig in (explore.static_view(reference), explore.static_view(None)):
        assert all(label.endswith("B") for label in fig.layout.yaxis2.ticktext)


def test_a_build_keeps_its_colour_whatever_else_is_shown_and_ours_are_drawn_heavier():
    def lines(names):  # the model's traces of the first panel, without a GPU
        ex = explore.Explorer("cpu", reference=None, check=False, builds=names)
        return {t.name.removesuffix(" (model)"): t.line for t in ex.figure.data if t.xaxis == "x"}

    one = lines(("fused", "sdpa_flash"))
    two = lines(("materialised", "qk_softmax", "fused", "sdpa_flash", "fused-no_pv"))
    assert one["fused"].color == two["fused"].color and one["sdpa_flash"].color == two["sdpa_flash"].color
    colours = {n: two[n].color for n in ("materialised", "qk_softmax", "fused", "sdpa_flash")}
    assert len(set(colours.values())) == 4  # one colour a build
    assert two["fused-no_pv"].color == two["fused"].color and two["fused-no_pv"].dash == "dash"  # its base's, dashed
    assert two["fused"].width > two["sdpa_flash"].width
    from attnlab.report.palette import BUILD_COLOURS
    assert colours == {n: BUILD_COLOURS[n] for n in colours}  # the lab's palette, not one of the explorer's own


def test_n_ticks_are_powers_of_two_written_out_and_few_enough_for_a_narrow_panel(reference):
    assert explore.n_axis([512, 1024, 2048, 4096, 8192])["ticktext"] == ["512", "1024", "2048", "4096", "8192"]
    wide = explore.n_axis(explore.N_OPTIONS)
    assert wide["ticktext"] == ["64", "256", "1024", "4096", "16384", "65536"]  # every second power: six at most
    assert explore.n_axis([1000])["tickvals"] == [1000] and explore.n_axis([]) == {}
    ex = explore.Explorer("cpu", reference=reference, check=False)
    for i in ("", "2", "3"):
        shown = [x for t in ex.figure.data if t.xaxis == f"x{i}" for x in t.x]
        ticks = ex.figure.layout[f"xaxis{i}"].tickvals
        assert min(shown) <= min(ticks) and max(ticks) <= max(shown) and len(ticks) <= 6
