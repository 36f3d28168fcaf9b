"""A real model's training step per build (attnlab.model_train) and its notebook section
(attnlab.report.training_step), on a tiny Llama in Triton's interpreter: every build with a backward gives
transformers' SDPA loss and parameter gradients within the rule, the model runs our builds' training forward and the
backward registered with it, a planted wrong gradient fails the rule, a build that raises is a row, bad input is one
error before any work, and the section's figure and sentences come from the rows."""
import importlib.util
import math

import pytest
import torch

from attnlab import hf_attention, model_forward as mf, model_train as mt
from attnlab.builds import training
from attnlab.report import palette, training_step as ts
from tests.test_accessibility import axis_problems

pytest.importorskip("transformers", reason="the model extra: pip install -e '.[model]'")

TINY = mf.ModelSpec("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=128)
HAS_FUSED_TRAIN = importlib.util.find_spec(training.FUSED_TRAIN) is not None
CHECKED = ("materialised", "qk_softmax", "fused", "torch_eager", "sdpa_math")
QUICK = dict(reps_ms=0, min_reps=1)  # one timed step after the warm-up: these times measure Python
EPS = 1e-4  # the planted error in dV: ten times float32's floor


@pytest.fixture(scope="module")
def rows():
    return mt.measure(TINY, list(CHECKED), B=1, N=16, dtype="float32", device="cpu", seed=0, **QUICK)


@pytest.fixture
def planted(monkeypatch):
    """Register some builds' names with other attention functions for one test (attnlab.model_forward.build
    registers every build again), then put the real ones back."""
    real = hf_attention.attention_function

    def plant(functions: dict):
        monkeypatch.setattr(hf_attention, "attention_function", lambda b: functions.get(b) or real(b))

    yield plant
    monkeypatch.undo()
    hf_attention.register()


def sdpa(query, key, value):
    o = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).contiguous(), None


def wrong_dv(module, query, key, value, attention_mask, **kw):
    """SDPA's output exactly, with dV (1 + EPS) times what it is: a backward that is wrong and a forward that is
    not."""
    extra = value * EPS
    return sdpa(query, key, value + (extra - extra.detach()))


def raises(error):
    def attend(*args, **kw):
        raise error
    return attend


def test_every_build_gives_sdpas_loss_and_gradients_within_the_rule(rows):
    assert list(rows.columns) == list(mt.COLUMNS)
    assert list(rows["build"]) == [mt.REFERENCE, mt.YARDSTICK, *CHECKED]
    names = {n for n, _ in mf.build(TINY).named_parameters()}
    for r in rows.itertuples():
        if r.build == "fused" and not HAS_FUSED_TRAIN:
            assert r.status.startswith("unsupported:") and training.FUSED_TRAIN in r.status and not r.matches
            continue
        assert r.status == "ok", r
        assert r.matches and r.over_limit <= 1 and r.over_limit_at in names | {mt.LOSS}, r
        assert r.loss_diff < 1e-5 and r.grad_rel_max < 1e-5 and r.grad_rel_tensor in names, r
        assert abs(r.loss - math.log(TINY.vocab)) < 0.5  # random weights: about uniform over the vocabulary
        assert math.isnan(r.peak_bytes) and "CPU" in r.peak_note
        assert r.step_ms > 0 and r.step_reps >= 1 and "Python" in r.timer
        assert r.grad_bytes == 4 * r.params and r.device == "cpu"
    ref, eager = rows.iloc[0], rows.iloc[1]
    assert ref["loss_diff"] == 0 and ref["over_limit"] == 0 and "reference" in ref["note"]
    assert 0 < eager["grad_rel_max"] and eager["over_limit"] <= 0.5 and "yardstick" in eager["note"]
    assert rows.set_index("build").loc["materialised", "saved"] == "P"


@pytest.mark.parametrize("build", ["materialised", "qk_softmax", "fused"])
def test_the_model_runs_our_builds_training_forward_and_the_backward_registered_with_it(build):
    """hf_attention calls torch.ops.attnlab.<build>; with grad on and q, k, v requiring it (they come from trainable
    projections), the op is the build's forward op, whose registered autograd node sits in the loss's graph once a
    layer."""
    if build == "fused" and not HAS_FUSED_TRAIN:
        pytest.skip(f"{training.FUSED_TRAIN} is not in this checkout: the fused build's backward comes with it")
    model = mt.trainable(mf.build(TINY, seed=0))
    assert model.training and all(p.requires_grad for p in model.parameters())
    ids = mf.token_ids(TINY, 1, 16, 0, "cpu")
    mf.use(model, build)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    seen, stack, names = set(), [loss.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        stack += [n for n, _ in node.next_functions]
    assert sum(f"attnlab_{build}_forward" in n for n in names) == TINY.layers
    with torch.no_grad():  # no grad: the inference op, which records nothing
        assert model(input_ids=ids, labels=ids, use_cache=False).loss.grad_fn is None


def test_the_rule_is_twice_the_eager_paths_difference_or_the_dtypes_floor():
    f32 = torch.float32
    yard = {mt.LOSS: 0.0, "a": 1e-3, "b": 1e-7}
    assert mt.limit("a", yard, f32) == 2e-3 and mt.limit("b", yard, f32) == 1e-5 == mt.limit("c", yard, f32)
    assert mt.limit("a", {"a": math.nan}, f32) == 1e-5 and mt.limit("a", {}, torch.bfloat16) == 1.5e-2
    at_limit = mt.judge({mt.LOSS: 0.0, "a": 2e-3, "b": 1e-5}, yard, f32)
    assert at_limit == {"over_limit": 1.0, "over_limit_at": "a", "matches": True}
    over = mt.judge({mt.LOSS: 0.0, "a": 1e-3, "b": 1.01e-5}, yard, f32)
    assert over["over_limit_at"] == "b" and not over["matches"]
    assert mt.judge({mt.LOSS: math.nan, "a": 0.0}, yard, f32) == {"over_limit": math.inf, "over_limit_at": mt.LOSS,
                                                                  "matches": False}


def test_a_planted_wrong_gradient_fails_the_rule(planted):
    """An attention whose forward is SDPA's and whose dV is (1 + 1e-4) times too large: the loss matches, the
    gradients do not (by about 1e-4, ten times float32's floor)."""
    planted({"materialised": wrong_dv})
    rows = mt.measure(TINY, ["materialised", "torch_eager"], B=1, N=16, **QUICK).set_index("build")
    wrong = rows.loc["materialised"]
    assert wrong["status"] == "ok" and wrong["loss_diff"] < 1e-6
    assert not wrong["matches"] and wrong["over_limit"] > 1 and wrong["over_limit_at"].startswith("model.layers.")
    assert EPS / 2 < wrong["grad_rel_max"] < 10 * EPS
    assert rows.loc["torch_eager", "matches"]
    text = ts.match_sentence(rows.reset_index())
    assert "2 of 3 builds" in text and f"Outside it: materialised, whose {wrong['over_limit_at']}" in text


def test_a_build_that_raises_is_a_row_and_the_others_still_run(planted):
    planted({"qk_softmax": raises(RuntimeError("planted")),
             "materialised": raises(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."))})
    rows = mt.measure(TINY, ["qk_softmax", "materialised", "sdpa_math"], B=1, N=8, **QUICK).set_index("build")
    assert rows.loc["qk_softmax", "status"] == "error: RuntimeError: planted"
    assert rows.loc["materialised", "status"] == f"oom: {2 << 30} bytes wanted (the failed allocation)"
    for b in ("qk_softmax", "materialised"):
        assert not rows.loc[b, "matches"] and math.isnan(rows.loc[b, "loss"]) and math.isnan(rows.loc[b, "step_ms"])
    assert rows.loc["sdpa_math", "status"] == "ok" and rows.loc["sdpa_math", "matches"]
    assert "Did not run: qk_softmax (error: RuntimeError: planted); materialised (oom:" in \
        ts.match_sentence(rows.reset_index())


@pytest.mark.parametrize("kw, message", [
    (dict(builds=["nope"]), "build must be one of"),
    (dict(builds=["copy_v"]), "build must be one of"),
    (dict(builds=["fused-no_pv"]), "build must be one of"),
    (dict(builds=[]), "builds must be a non-empty list"),
    (dict(builds="fused"), "builds must be a non-empty list"),
    (dict(N=1), r"N must be a whole number >= 2 \(the loss predicts each next token\); got 1"),
    (dict(B=0), "B must be a whole number >= 1"),
    (dict(dtype="float64"), "dtype must be one of float32, float16, bfloat16"),
    (dict(device="nonsense"), "device must be a torch device such as 'cpu' or 'cuda'; got 'nonsense'"),
    *([(dict(device="cuda"), "torch sees no CUDA device here")] if not torch.cuda.is_available() else []),
])
def test_bad_input_is_one_error_before_any_work(monkeypatch, kw, message):
    monkeypatch.setattr(mf, "build", lambda *a, **k: pytest.fail("a model was built"))
    args = {**dict(builds=["fused"], B=1, N=8, dtype="float32"), **kw}
    with pytest.raises(ValueError, match=message):
        mt.measure(TINY, **args)


@pytest.mark.parametrize("missing", [mt.REFERENCE, mt.YARDSTICK])
def test_without_the_reference_or_the_yardstick_the_rows_stand_and_say_so(monkeypatch, missing):
    use = mf.use

    def use_but(model, build):
        if build == missing:
            raise RuntimeError("planted")
        use(model, build)

    monkeypatch.setattr(mf, "use", use_but)
    rows = mt.measure(TINY, ["sdpa_math"], B=1, N=8, **QUICK)
    by = rows.set_index("build")
    assert by.loc[missing, "status"] == "error: RuntimeError: planted" and not by.loc[missing, "matches"]
    others = by.drop(missing)
    assert (others["status"] == "ok").all()
    if missing == mt.REFERENCE:
        assert others["over_limit"].isna().all() and not others["matches"].any()
        assert (others["note"] == f"{mt.REFERENCE} did not run: no reference to compare with").all()
        assert ts.match_sentence(rows).startswith("No build was compared with transformers' SDPA path")
        assert "Not compared (transformers_sdpa did not run): transformers_eager, sdpa_math." in ts.match_sentence(rows)
    else:  # every limit is float32's floor, which sdpa_math's rounding stays within
        assert by.loc["sdpa_math", "matches"] and "every limit is the dtype's floor" in by.loc["sdpa_math", "note"]


def test_a_training_step_refuses_what_gives_no_loss_before_touching_the_model():
    ids = mf.token_ids(TINY, 2, 8, 0, "cpu")
    with pytest.raises(ValueError, match="build must be one of"):
        mt.training_step(None, "copy_v", ids, ids)
    with pytest.raises(ValueError, match="N .* must be >= 2"):
        mt.training_step(None, "fused", ids[:, :1], ids[:, :1])
    with pytest.raises(ValueError, match="labels must have ids' shape"):
        mt.training_step(None, "fused", ids, ids[:1])
    with pytest.raises(ValueError, match=r"ids must be a \(B, N\) tensor of token ids"):
        mt.training_step(None, "fused", ids.float(), ids)


def test_the_section_draws_each_build_in_its_colour_and_says_what_the_rows_say(rows):
    fig, text = ts.section(rows)
    ran = [b for b, s in zip(rows["build"], rows["status"]) if s == "ok"]
    assert [t.name for t in fig.data if t.showlegend is not False] == ran
    assert all(t.marker.color == palette.colour(t.meta["build"]) != palette.OTHER for t in fig.data)
    assert axis_problems(fig) == [] and "time.perf_counter" in fig.layout.yaxis2.title.text
    judged = len(ran) - 1
    assert f"{judged} of {judged} builds give its loss and every parameter's gradient" in text
    assert ("Did not run: fused" in text) != HAS_FUSED_TRAIN
    assert "Peak memory is not known here" in text and "they measure Python" in text
    assert palette.colour(mt.REFERENCE) not in {palette.colour(b) for b in palette.BUILD_COLOURS
                                                if b != mt.REFERENCE}


def test_the_memory_and_time_sentences_compute_savings_against_the_baseline(rows):
    gpu = rows.copy()
    gpu["device"] = "cuda:0"
    peaks = {"transformers_eager": 8 << 20, "materialised": 4 << 20, "qk_softmax": 3 << 20, "torch_eager": 5 << 20}
    times = {"materialised": 2.0, "qk_softmax": 0.5, "torch_eager": 4.0}
    gpu["peak_bytes"] = gpu["build"].map(peaks)
    gpu["step_ms"] = gpu["build"].map(times)
    text = ts.memory_sentence(gpu)
    assert text.startswith("A step with materialised peaks at 4 MiB above the weights")
    assert "qk_softmax saves 1 MiB (25% less)" in text and "torch_eager holds 1 MiB (25% more)" in text
    assert "transformers_eager holds 4 MiB (100% more)" in text
    assert ts.memory_sentence(gpu, baseline="flex").startswith("A step with transformers_eager peaks at 8 MiB")
    assert ts.time_sentence(gpu) == ("The fastest step is qk_softmax's, 0.5 ms (CUDA events, after a warm-up step); "
                                     "materialised's takes 2 ms, 4.00× as long.")
    with pytest.raises(ValueError, match="rows must hold one shape"):
        ts.section(gpu.assign(N=[8] * (len(gpu) - 1) + [16]))
