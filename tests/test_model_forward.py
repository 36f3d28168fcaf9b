"""Our builds as a transformers model's attention (attnlab.hf_attention), one forward measured per build
(attnlab.model_forward), the model sweep (attnlab.model_sweep) and the notebook's logic (attnlab.model_lab), on a tiny
Llama in Triton's interpreter: the logits against transformers' own SDPA path with the causal flag and with a padding
mask, grouped-query attention, the rows and their provenance, Amdahl's law, and the notebook rendered by papermill."""
import json
import math
import re

import pandas as pd
import pytest
import torch

from attnlab import hf_attention, model_forward as mf, model_lab as ml, model_sweep, reference, sweep
from attnlab.provenance import REPO

pytest.importorskip("transformers", reason="the model extra: pip install -e '.[model]'")

TINY = mf.ModelSpec("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=128)
OURS = ("materialised", "qk_softmax", "fused")
PARAMS = dict(name="t", device="cpu", dtype="float32", models=[dict(name="tiny", layers=2, hidden=64, heads=4,
              kv_heads=2, head_dim=16, intermediate=96, vocab=128)], seq_lens=[24], batches=[2], builds=["fused"],
              baseline="fused", windows=1, reps_ms=1, min_reps=1)


@pytest.fixture(scope="module")
def tiny():
    return mf.build(TINY, seed=0)


def _logits(model, build, ids, mask=None):
    return mf.forward(model, build, ids, mask).float()


def test_the_model_is_made_in_its_dtype_with_its_rotary_frequencies_in_float32():
    m = mf.build(TINY, dtype="bfloat16", seed=1)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16} and m.model.rotary_emb.inv_freq.dtype == torch.float32
    again = mf.build(TINY, dtype="bfloat16", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), again.parameters()))  # the seed draws the weights
    layer = 64 * (64 + 2 * 32 + 64) + 3 * 64 * 96 + 2 * 64  # q, k, v, o (k and v on 2 heads of 16), MLP, two norms
    assert sum(p.numel() for p in m.parameters()) == 2 * 128 * 64 + 2 * layer + 64  # embedding, head, final norm


def test_register_adds_every_build_to_both_of_transformers_tables(tiny):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    names = hf_attention.register()
    for build in (*OURS, "torch_eager", "sdpa_flash", "flex", "copy_v"):
        name = hf_attention.impl_name(build)
        assert name in names and name.startswith("attnlab_")
        assert name in AttentionInterface() and name in ALL_MASK_ATTENTION_FUNCTIONS
    assert not any(n.endswith(("no_pv", "no_softmax", "zero_mask")) for n in names)  # ablations of attention alone
    tiny.set_attn_implementation("attnlab_fused")
    assert tiny.config._attn_implementation == "attnlab_fused"
    with pytest.raises(ValueError, match="build must be one of"):
        hf_attention.impl_name("fused-no_pv")


@pytest.mark.parametrize("build", OURS)
def test_each_of_our_builds_gives_sdpas_logits_causal_and_padded(tiny, build):
    ids = mf.token_ids(TINY, 2, 24, 0, "cpu")
    ref = _logits(tiny, "transformers_sdpa", ids)
    assert (_logits(tiny, build, ids) - ref).abs().max() < 1e-5
    mask = mf.padding_mask(2, 24, "cpu")
    assert mask[1, :6].sum() == 0 and mask[0].all()  # the last sequence left-padded by a quarter
    real = mask.bool()
    padded_ref = _logits(tiny, "transformers_sdpa", ids, mask)
    assert (_logits(tiny, build, ids, mask)[real] - padded_ref[real]).abs().max() < 1e-5
    assert (padded_ref[1, 6:] - ref[1, 6:]).abs().max() > 1e-3  # the padding changes the real tokens' logits


def test_every_registered_name_can_be_the_models_attention(tiny):
    """transformers reads a name holding "flash" as a request for a flash-attn kernel it then fails to load:
    sdpa_flash goes by an alias, and runs (SDPA's flash backend has a CPU kernel)."""
    names = hf_attention.register()
    assert not [n for n in names if "flash" in n] and hf_attention.impl_name("sdpa_flash") == "attnlab_sdpa_fa2"
    for name in names:
        tiny.set_attn_implementation(name)
        assert tiny.config._attn_implementation == name
    ids = mf.token_ids(TINY, 1, 8, 0, "cpu")
    assert (_logits(tiny, "sdpa_flash", ids) - _logits(tiny, "transformers_sdpa", ids)).abs().max() < 1e-5


def test_a_registration_that_drops_the_causal_mask_is_caught(tiny, monkeypatch):
    """The comparison can fail: the same kernel told the sequence is not causal gives other logits."""
    from transformers import AttentionInterface

    fused = hf_attention.attention_function("fused")

    def no_causal(module, query, key, value, attention_mask, **kw):
        return fused(module, query, key, value, attention_mask, is_causal=False, **kw)

    AttentionInterface.register("attnlab_test_no_causal", no_causal)
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register("attnlab_test_no_causal", sdpa_mask)
    ids = mf.token_ids(TINY, 1, 24, 0, "cpu")
    ref = _logits(tiny, "transformers_sdpa", ids)
    tiny.set_attn_implementation("attnlab_test_no_causal")
    with torch.inference_mode():
        wrong = tiny(input_ids=ids, use_cache=False).logits.float()
    assert (wrong - ref).abs().max() > 1e-3


def test_the_model_hands_our_build_the_causal_flag_or_the_padding_mask_and_kv_heads_unrepeated(tiny, monkeypatch):
    from attnlab.builds import ops

    seen = []
    real, real_get = ops.get("fused"), ops.get

    def spy(q, k, v, attn_mask, causal, scale):  # the op, as hf_attention calls it
        seen.append((q.shape[1], k.shape[1], causal, None if attn_mask is None else (tuple(attn_mask.shape),
                                                                                    attn_mask.dtype)))
        return real(q, k, v, attn_mask, causal, scale)

    monkeypatch.setattr(ops, "get", lambda name: spy if name == "fused" else real_get(name))
    hf_attention.register()
    ids = mf.token_ids(TINY, 2, 24, 0, "cpu")
    _logits(tiny, "fused", ids)
    assert seen == [(4, 2, True, None)] * TINY.layers  # GQA: 4 query heads on 2 k/v heads, as the model has them
    seen.clear()
    _logits(tiny, "fused", ids, mf.padding_mask(2, 24, "cpu"))
    assert seen == [(4, 2, False, ((2, 1, 24, 24), torch.bool))] * TINY.layers
    monkeypatch.undo()
    hf_attention.register()


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (4, 4)])
def test_grouped_query_attention_against_the_oracle(heads, kv_heads):
    """attention_function alone, as transformers calls it, against the fp64 oracle with its own head mapping."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 20, 16, generator=g)
    k, v = torch.randn(2, kv_heads, 20, 16, generator=g), torch.randn(2, kv_heads, 20, 16, generator=g)
    module = type("M", (), {"is_causal": True, "num_key_value_groups": heads // kv_heads})()
    o, weights = hf_attention.attention_function("fused")(module, q, k, v, None, scaling=0.3)
    assert weights is None and o.shape == (2, 20, heads, 16)
    ref = reference.attend(q, k, v, causal=True, scale=0.3).float().transpose(1, 2)
    assert (o - ref).abs().max() < 1e-5
    o_copy, _ = hf_attention.copy_v(module, q, k, v, None)
    for h in range(heads):
        assert torch.equal(o_copy[:, :, h], v[:, h // (heads // kv_heads)])


def test_what_our_builds_cannot_take_is_refused_before_any_kernel():
    f = hf_attention.attention_function("fused")
    module = type("M", (), {"is_causal": True})()
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 9, 16)
    with pytest.raises(hf_attention.Unsupported, match="decoding with a KV cache"):
        f(module, q, k, k, None)
    q = torch.randn(1, 2, 9, 16)
    with pytest.raises(hf_attention.Unsupported, match="dropout"):
        f(module, q, k, k, None, dropout=0.1)
    with pytest.raises(hf_attention.Unsupported, match="softcap"):
        f(module, q, k, k, None, softcap=30.0)


def test_without_transformers_the_lab_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(hf_attention, "available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[model\]'"):
        hf_attention.require()
    with pytest.raises(ImportError, match="transformers"):
        model_sweep.run(PARAMS, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    run = ml.Run(tmp_path, model_sweep.validate(PARAMS), "cpu", {})
    assert "pip install -e '.[model]'" in ml.sweep_run(run).data
    assert "not installed" in ml.setup()["transformers"]


def test_params_are_checked_key_by_key():
    p = model_sweep.validate(PARAMS)
    assert p["builds"] == ["transformers_sdpa", "copy_v", "fused"] and p["baseline"] == "fused"
    for bad, match in [(dict(colour=1), "'colour'"), (dict(builds=["fused", "nope"]), "'builds': value 'nope'"),
                       (dict(models=[{**PARAMS["models"][0], "kv_heads": 3}]), "multiple of kv_heads"),
                       (dict(models=[{**PARAMS["models"][0], "depth": 3}]), r"'models\[0\].depth'"),
                       (dict(models=[{k: v for k, v in PARAMS["models"][0].items() if k != "vocab"}]), "vocab"),
                       (dict(baseline="materialised"), "'baseline'"), (dict(max_tokens=10), "no shape"),
                       (dict(seq_lens=[0]), "must be > 0"), (dict(device="tpu"), "'device'")]:
        with pytest.raises(sweep.ParamsError, match=match):
            model_sweep.validate({**PARAMS, **bad})
    for path in ("params/model/cpu.yaml", "params/model/h200.yaml"):
        p = model_sweep.load_params(REPO / path)
        assert p["builds"][:2] == ["transformers_sdpa", "copy_v"] and {"materialised", "fused"} <= set(p["builds"])
    h200 = model_sweep.load_params(REPO / "params/model/h200.yaml")
    assert max(B * N for B, N in model_sweep.shapes(h200)) <= h200["max_tokens"]


def test_the_sweep_writes_rows_with_provenance_and_resumes(tmp_path):
    out = tmp_path / "run"
    df = model_sweep.run(PARAMS, out, progress=False)
    assert list(df["build"]) == ["transformers_sdpa", "copy_v", "fused"] and (df["status"] == "ok").all()
    fused = df.set_index("build").loc["fused"]
    assert fused["logits_maxdiff"] < 1e-5 and fused["padded_maxdiff"] < 1e-5 and fused["forward_ms"] > 0
    assert fused["attention_ms"] > 0 and (fused["H"], fused["Hkv"], fused["layers"]) == (4, 2, 2)
    assert df.set_index("build").loc["copy_v", "logits_maxdiff"] > 1e-3  # no attention: other logits
    assert "reference" in df.set_index("build").loc["transformers_sdpa", "err_note"]
    assert df["peak_bytes"].isna().all() and (df["peak_note"] != "").all()  # a CPU has no allocator statistics
    prov = json.loads((out / model_sweep.PROVENANCE).read_text())
    assert prov["results"] == model_sweep.RESULTS and prov["software"]["transformers"]
    assert prov["params"]["models"][0]["name"] == "tiny" and prov["sessions"][0]["measured"] == 3
    assert prov["git"] and prov["code"] and prov["ended"]
    lines = (out / model_sweep.RESULTS).read_text().splitlines()
    (out / model_sweep.RESULTS).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # a crash mid-row
    again = model_sweep.run(PARAMS, out, progress=False)
    assert len(again) == 3 and list(again["build"]) == ["transformers_sdpa", "copy_v", "fused"]
    assert json.loads((out / model_sweep.PROVENANCE).read_text())["sessions"][1]["measured"] == 1
    assert ml.find_runs(tmp_path) == [out] and ml.reference_run(tmp_path) is None  # a CPU run teaches no speed
    assert sweep.RESULTS not in [p.name for p in out.iterdir()]  # attnlab.runs never takes it for an attention run


def test_amdahl():
    assert ml.amdahl(0.5, 2) == pytest.approx(4 / 3)
    assert ml.amdahl(0.0, 100) == 1.0 and ml.amdahl(1.0, 5) == pytest.approx(5)
    assert ml.amdahl(0.75, 1e12) == pytest.approx(4)  # the ceiling 1 / (1 − f)
    for f, s in [(-0.1, 2), (1.5, 2), (0.5, 0)]:
        with pytest.raises(ValueError):
            ml.amdahl(f, s)


def _rows(values: dict, device="cuda:0") -> pd.DataFrame:
    """Result rows of one model at B = 1: values {(N, build): (forward_ms, attention_ms)}."""
    rows = []
    for (N, build), (fwd, attn) in values.items():
        row = mf.blank_row()
        row.update(model="m", B=1, N=N, build=build, status="ok", forward_ms=fwd, attention_ms=attn, layers=4,
                   device=device, case_id=f"m|1|{N}|bfloat16|{build}", dtype="bfloat16", H=16, Hkv=4, D=128,
                   peak_bytes=float(N << 20) if build == "materialised" else float(N << 10))
        rows.append(row)
    return pd.DataFrame(rows)


def test_amdahl_table_reads_share_and_speedups_off_the_rows():
    t = ml.amdahl_table(_rows({(1024, "materialised"): (10.0, 1.0), (1024, "copy_v"): (6.0, 0.05),
                               (1024, "fused"): (7.0, 0.25)}))
    r = t.iloc[0]
    assert r["share"] == pytest.approx(0.4) and r["share_alone"] == pytest.approx(0.4)
    assert r["attn_speedup"] == pytest.approx(4.0) and r["attn_speedup_in_model"] == pytest.approx(4.0)
    assert r["predicted"] == pytest.approx(1 / (0.6 + 0.1)) and r["measured"] == pytest.approx(10 / 7)
    assert r["ceiling"] == pytest.approx(1 / 0.6)
    failed = _rows({(1024, "materialised"): (10.0, 1.0), (1024, "fused"): (7.0, 0.25)})
    assert ml.amdahl_table(failed).empty  # without copy_v there is no share to read


def _gpu_run(folder):
    """A made-up GPU model run: attention's share grows with N, fused 3-4x faster at attention alone."""
    folder.mkdir(parents=True)
    df = _rows({(1024, "transformers_sdpa"): (3.5, 0.1), (1024, "copy_v"): (3.0, 0.02),
                (1024, "materialised"): (5.0, 0.6), (1024, "fused"): (3.6, 0.15),
                (8192, "transformers_sdpa"): (11.6, 1.2), (8192, "copy_v"): (8.0, 0.1),
                (8192, "materialised"): (20.0, 3.0), (8192, "fused"): (11.4, 0.9)})
    for row in df.to_dict("records"):
        row["logits_maxdiff"] = math.nan if row["build"] == "transformers_sdpa" else 0.05
        model_sweep.append_row(folder / model_sweep.RESULTS, row)
    prov = dict(device=dict(device="cuda:0", name="NVIDIA H200"), started="2026-12-05T10:00:00+00:00",
                params=dict(baseline="materialised"), git=dict(commit="0123456789abcdef"), results=model_sweep.RESULTS)
    (folder / model_sweep.PROVENANCE).write_text(json.dumps(prov))
    return folder


def test_lessons_come_from_the_newest_gpu_run_and_the_questions_answer_from_it(tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(root))
    cpu = ml.Run(tmp_path / "cpu", model_sweep.validate(PARAMS), "cpu", {})
    assert ml.lessons(cpu, root) is None
    assert "STEPS=model bash scripts/device.sh" in ml.source_note(cpu).data
    gpu = _gpu_run(root / "h200" / "x-model")
    les = ml.lessons(cpu, root)
    assert les.folder == gpu and not les.own and "NVIDIA H200" in les.label
    note = ml.source_note(cpu).data
    assert "From a committed GPU run" in note and str(gpu) in note and "no GPU" in note
    qs = {q.question: q.answer for q in ml.questions(cpu, les)}
    largest = next(a for q, a in qs.items() if q.startswith("Where is attention's share"))
    assert "N = 8192" in largest and "f = 0.60" in largest and "2.50×" in largest  # (20 − 8) / 20; 1 / 0.4
    gap = next(a for q, a in qs.items() if "why does the whole forward gain less" in q)
    assert "4.00×" in gap and "1.39×" in gap and "1.43×" in gap  # s = 0.6 / 0.15, 5 / 3.6, 1 / (0.6 + 0.4 / 4)
    trend = next(a for q, a in qs.items() if "change with the sequence length" in q)
    assert "f = 0.40 (N = 1024) → 0.60 (N = 8192)" in trend and "Where f rises it rises" in trend
    html = ml.check_yourself(cpu, les).data
    assert html.count("<details>") == len(qs)


def test_the_questions_pick_the_largest_logits_difference_and_the_largest_miss(tmp_path):
    """Each answer reads its own row: the build furthest from SDPA's logits, and the shape where Amdahl's law misses
    most (N = 1024: predicted 1 / (0.6 + 0.4 / 4) = 1.43×, measured 5 / 3.6 = 1.39×, off by 2.8 %; N = 8192: 1.72×
    against 1.75×, off by 1.8 %)."""
    results = _rows({(24, "materialised"): (5.0, 0.6), (24, "fused"): (3.6, 0.15),
                     (24, "transformers_eager"): (6.0, 1.0)}, device="cpu")
    results["logits_maxdiff"] = [0.02, 0.07, 0.03]
    cpu = ml.Run(tmp_path / "cpu", model_sweep.validate(PARAMS), "cpu", {}, results)
    les = ml.lessons(cpu, _gpu_run(tmp_path / "outputs" / "h200" / "x-model").parent.parent)
    qs = {q.question: q.answer for q in ml.questions(cpu, les)}
    logits = next(a for q, a in qs.items() if q.startswith("How far are our builds' logits"))
    assert logits.startswith("At most 0.07 (fused, m)") and "up to 0.03" in logits, logits
    miss = next(a for q, a in qs.items() if "Amdahl's law predict" in q)
    assert "N = 1024: predicted 1.43×, measured 1.39×" in miss, miss


def test_a_runs_own_rows_are_those_its_device_column_puts_on_a_gpu_read_when_asked(tmp_path):
    root = tmp_path / "outputs"
    _gpu_run(root / "h200" / "x-model")
    run = ml.Run(tmp_path / "run", model_sweep.validate({**PARAMS, "baseline": "fused"}), "cpu", {})
    assert not ml.lessons(run, root).own  # no rows yet: the committed run stands in
    run.results = _rows({(1024, "copy_v"): (3.0, 0.02), (1024, "fused"): (3.6, 0.15)}, device="cpu")
    assert not ml.lessons(run, root).own  # a CPU's rows teach no speed, whatever the machine
    run.results = pd.concat([run.results, _rows({(2048, "copy_v"): (3.0, 0.02), (2048, "fused"): (3.7, 0.1)})])
    les = ml.lessons(run, root)  # the rows as they are now: a sweep that replaced them is read
    assert les.own and les.folder == run.out and set(les.results["N"]) == {2048} and les.baseline == "fused"
    failed = _rows({(1024, "fused"): (3.6, 0.15)})
    failed["status"] = "oom: 2 GiB"
    gpu = ml.Run(tmp_path / "gpu", model_sweep.validate({**PARAMS, "device": "cuda"}), "cuda:0", {}, failed)
    stand_in = ml.lessons(gpu, root)  # a GPU run with no ok row of ours: the committed run stands in, said so
    assert not stand_in.own
    assert "this run has no ok GPU row of our builds" in ml.source_note(gpu, stand_in).data


def test_the_launch_floor_is_a_flat_time_over_a_fourfold_growth_of_flops():
    def floor(ms: dict, build="fused"):
        return ml.launch_floor(_rows({(n, build): (1.0, t) for n, t in ms.items()}))

    t = floor({1024: 0.141, 2048: 0.134, 4096: 0.137, 8192: 0.49})
    assert list(t[["first_N", "last_N"]].iloc[0]) == [1024, 4096] and t["flops_growth"].iloc[0] == 16
    assert len(floor({1024: 0.1, 2048: 0.119})) == 1  # 19 % over 4x the FLOPs: flat
    assert floor({1024: 0.1, 2048: 0.121}).empty  # 21 %: the time follows the work
    assert floor({1024: 0.1, 1448: 0.1}).empty  # the same time, but the FLOPs grow 2x only
    assert floor({1024: 0.02, 2048: 0.02}, build="copy_v").empty  # copy_v computes no attention
    assert "No build's attention alone stays within 20%" in ml.floor_note(_rows({(1024, "fused"): (1.0, 0.1)}))


def test_where_f_falls_the_note_gives_only_the_reasons_the_rows_show():
    falls = {(1024, "materialised"): (5.0, 1.0), (1024, "copy_v"): (3.0, 0.02), (1024, "fused"): (4.0, 0.3),
             (2048, "materialised"): (9.5, 3.9), (2048, "copy_v"): (6.0, 0.02), (2048, "fused"): (7.0, 1.0)}
    note = ml.share_note(_rows(falls))  # f: 0.40 -> 0.37; inside = 0.5 ms a layer, alone 1.0; copy_v 2x for 2x
    assert "f = 0.40 (N = 1024) → 0.37 (N = 2048). It falls" in note
    assert "no reason shows in these rows" in note and "Where f rises" not in note
    host = {**falls, (2048, "copy_v"): (4.0, 0.02), (2048, "materialised"): (5.7, 1.2)}  # f: 0.40 -> 0.30
    note = ml.share_note(_rows(host))
    assert "copy_v's forward grows 1.33× for 2× the tokens" in note
    assert "materialised's attention alone grows 1.20× while its FLOPs grow 4×" in note and "Each says" in note
    assert "no reason shows" not in note


def test_a_failing_cell_gives_a_non_zero_code_and_keeps_the_folder(tmp_path):
    import papermill

    import nbformat

    def fail(src, dst, **kw):  # papermill's partial notebook: the failing cell holds the error output
        heading = nbformat.v4.new_markdown_cell("## The sweep")
        cell = nbformat.v4.new_code_cell("run_sweep()", execution_count=4,
                                         outputs=[nbformat.v4.new_output("error", ename="RuntimeError", evalue="boom",
                                                                         traceback=[])])
        nbformat.write(nbformat.v4.new_notebook(cells=[heading, cell]), dst)
        raise papermill.PapermillExecutionError(1, 4, "boom", "RuntimeError", "boom", [])

    result = ml.render_notebook(REPO / "params/model/cpu.yaml", tmp_path / "out", execute=fail)
    assert result.code == 1 and result.html.exists()
    assert "In [4] of section 'The sweep': 'run_sweep()' failed: RuntimeError: boom" in result.message
    with pytest.raises(sweep.ParamsError):
        ml.render_notebook(tmp_path / "missing.yaml", tmp_path / "out2", execute=fail)


def test_the_notebook_renders_the_cpu_run_and_a_committed_gpu_run(tmp_path, monkeypatch):
    import nbformat
    import yaml

    _gpu_run(tmp_path / "outputs" / "h200" / "x-model")
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(tmp_path / "outputs"))  # the kernel inherits it
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(PARAMS))
    result = ml.render_notebook(params, tmp_path / "render")
    assert result.code == 0, result.message
    nb = nbformat.read(str(result.notebook), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("data", {}).get("text/markdown", ""))
                     + str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert "From a committed GPU run" in text and "NVIDIA H200" in text
    committed = f"the committed run {tmp_path / 'outputs' / 'h200' / 'x-model'}, measured on NVIDIA H200"
    assert text.count(f"Rows: from a committed GPU run, not from this machine: {committed}") == 5  # every section
    assert "These rows hold no compiled forward: the params named no `compile_modes`." in text  # as deployed
    assert "Triton's interpreter" in text  # the CPU rows are labelled as Python's time
    assert text.count("<details>") >= 5 and "f = 0.60" in text
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) >= 3  # the law, the share, the speedups
    rows = model_sweep.read_results(result.out)
    assert list(rows["build"]) == ["transformers_sdpa", "copy_v", "fused"] and (rows["status"] == "ok").all()
    assert rows.set_index("build").loc["fused", "padded_maxdiff"] < 1e-5
    page = result.html.read_text(encoding="utf-8")
    assert len(re.findall(r"plotly\.js v\d", page)) == 1 and not re.search(r"<script[^>]*\bsrc=", page)  # offline


def test_the_committed_notebook_has_no_outputs_and_one_parameters_cell():
    import nbformat

    nb = nbformat.read(str(ml.NOTEBOOK), as_version=4)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    names = {line.split("=")[0].strip() for line in tagged[0].source.splitlines()
             if "=" in line and not line.startswith((" ", "#"))}
    assert names == {*ml.KEYS, "out_dir"}
