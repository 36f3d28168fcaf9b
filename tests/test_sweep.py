"""The sweep on the CPU: complete rows, append-only results that survive interruption and crashes, resume without
duplicates, OOM and error rows that let the sweep go on, and params checked before anything is written."""
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from attnlab import builds, cost
from attnlab import measure as m
from attnlab import sweep
from attnlab.builds import Build
from attnlab.schema import COLUMNS
from attnlab.sweep import ParamsError

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(device="cpu", dtype="float32", seq_lens=[32, 64], head_dims=[16], causal=[False, True],
            batch_policy="fixed", batch=1, heads=2, builds=["fused", "torch_eager", "sdpa_cudnn"],
            warmup_ms=0, reps_ms=1, min_reps=2)
N_CASES = 2 * 1 * 2 * 3


def lines(out: Path) -> list[str]:
    return (out / sweep.RESULTS).read_text().splitlines()


def test_a_tiny_sweep_writes_complete_rows(tmp_path, capsys):
    out = tmp_path / "run"
    df = sweep.run(TINY, out)
    assert list(df.columns) == list(COLUMNS) and len(df) == N_CASES
    assert df["case_id"].is_unique and set(df["run_id"]) == {"run"}
    assert df["causal"].dtype == bool and set(df["causal"]) == {False, True}
    assert set(df[df.build == "sdpa_cudnn"]["status"].str.slice(0, 13)) == {"unsupported: "}
    ok = df[df.build != "sdpa_cudnn"]
    assert (ok["status"] == "ok").all()
    numbers = ["cold_s", "ms", "ms_p20", "ms_p80", "consume_ms", "err", "err_limit", "checksum", "tflops", "tbps",
               "pct_flops", "pct_bw", "ceiling_tflops", "ceiling_tbps"]
    assert ok[numbers].notna().all().all() and (ok["reps"] >= 2).all()
    assert ok["peak_bytes"].isna().all() and (ok["peak_note"] == "n/a: CPU has no allocator statistics").all()
    assert (ok[ok.build == "fused"]["tiles"] != "").all() and (ok[ok.build == "torch_eager"]["tiles"] == "").all()
    # the file: one header, one whole line per case, every line the schema's width
    text = lines(out)
    assert text[0] == ",".join(COLUMNS) and len(text) == 1 + N_CASES
    assert sweep.read_results(out).equals(df)
    # provenance beside it
    prov = json.loads((out / sweep.PROVENANCE).read_text())
    for key in ("device", "software", "host", "git", "params", "ceilings", "started", "ended", "sessions"):
        assert prov[key] is not None, key
    assert prov["software"]["torch"] == torch.__version__ and prov["params"]["seq_lens"] == [32, 64]
    assert prov["ceilings"]["float32"]["tbps"] == df["ceiling_tbps"].iloc[0] > 0
    assert prov["sessions"][0]["measured"] == N_CASES and prov["sessions"][0]["interrupted"] is False
    # the progress bar named the cases as it went
    assert df["case_id"].iloc[-1] in capsys.readouterr().err


def test_an_interrupted_sweep_keeps_exactly_k_rows_and_resume_finishes_without_duplicates(tmp_path, monkeypatch):
    out, k = tmp_path / "run", 5
    real, measured = m.measure, []

    def stop_after_k(case, **kw):
        if len(measured) == k:
            raise KeyboardInterrupt  # what Ctrl-C does in the middle of case k + 1
        measured.append(case.case_id)
        return real(case, **kw)

    monkeypatch.setattr(m, "measure", stop_after_k)
    with pytest.raises(KeyboardInterrupt):
        sweep.run(TINY, out, progress=False)
    kept = sweep.read_results(out)
    assert len(kept) == k and list(kept["case_id"]) == measured
    assert len(lines(out)) == 1 + k
    prov = json.loads((out / sweep.PROVENANCE).read_text())
    assert prov["sessions"][-1]["interrupted"] is True and prov["sessions"][-1]["ended"]
    first = lines(out)

    resumed = []
    monkeypatch.setattr(m, "measure", lambda case, **kw: resumed.append(case.case_id) or real(case, **kw))
    df = sweep.run(TINY, out, progress=False)
    assert len(df) == N_CASES and df["case_id"].is_unique
    assert len(resumed) == N_CASES - k and not set(resumed) & set(measured)  # nothing measured twice
    assert lines(out)[: 1 + k] == first  # appended after, never rewritten
    prov = json.loads((out / sweep.PROVENANCE).read_text())
    assert [s["already_measured"] for s in prov["sessions"]] == [0, k]
    assert prov["ceilings"]["float32"]["tbps"] == df["ceiling_tbps"].iloc[-1]  # the run's ceilings, kept

    assert len(sweep.run(TINY, out, progress=False)) == N_CASES  # a third run has nothing left to do


def test_a_line_cut_short_by_a_crash_is_dropped_and_remeasured(tmp_path):
    out, params = tmp_path / "run", {**TINY, "builds": ["torch_eager"]}
    sweep.run(params, out, progress=False)
    whole = lines(out)
    assert len(whole) == 1 + N_CASES // 3
    with open(out / sweep.RESULTS, "w") as f:  # the crash hit mid-write: the last row is half there, no newline
        f.write("\n".join(whole[:-1]) + "\n" + whole[-1][: len(whole[-1]) // 2])
    assert len(sweep.read_results(out)) == len(whole) - 2  # the partial line is not a row
    df = sweep.run(params, out, progress=False)
    assert len(df) == N_CASES // 3 and df["case_id"].is_unique
    records = list(csv.reader(io.StringIO((out / sweep.RESULTS).read_text())))
    assert len(records) == 1 + N_CASES // 3 and all(len(r) == len(COLUMNS) for r in records)  # nothing glued on
    assert (out / sweep.RESULTS).read_text().startswith("\n".join(whole[:-1]) + "\n")  # the whole rows kept as written


def test_a_resume_with_other_params_is_refused_naming_what_changed_and_writes_nothing(tmp_path):
    """A run's rows and its provenance describe one set of params: a resume with others would append rows measured
    differently (another dtype, timing or seed) or cases its provenance does not list. Only where it is written may
    differ."""
    out, params = tmp_path / "run", {**TINY, "builds": ["torch_eager"], "seq_lens": [32]}
    sweep.run(params, out, progress=False)
    results, prov = (out / sweep.RESULTS).read_bytes(), (out / sweep.PROVENANCE).read_bytes()
    for change, says in (({"builds": ["torch_eager", "fused"]}, "builds: ['torch_eager'] then, ['torch_eager', 'fused'] now"),
                         ({"seq_lens": [32, 64]}, "seq_lens: [32] then, [32, 64] now"),
                         ({"reps_ms": 2, "seed": 3}, "reps_ms: 1.0 then, 2.0 now; seed: 0 then, 3 now"),
                         ({"dtype": "bfloat16"}, "dtype: 'float32' then, 'bfloat16' now")):
        with pytest.raises(ParamsError) as e:
            sweep.run({**params, **change}, out, progress=False)
        assert str(e.value).startswith(f"params key 'out_dir': value '{out}' holds a run measured with other params")
        assert says in str(e.value) and "\n" not in str(e.value)
        assert (out / sweep.RESULTS).read_bytes() == results and (out / sweep.PROVENANCE).read_bytes() == prov
    df = sweep.run({**params, "out_dir": str(tmp_path / "elsewhere")}, out, progress=False)  # --out wins; same run
    assert len(df) == 2 and len(json.loads((out / sweep.PROVENANCE).read_text())["sessions"]) == 2


def test_a_resume_on_another_device_is_refused_and_writes_nothing(tmp_path):
    """A folder measured on one GPU is never topped up on another: its rows' times would not be comparable."""
    out, params = tmp_path / "run", {**TINY, "builds": ["torch_eager"], "seq_lens": [32]}
    sweep.run(params, out, progress=False)
    prov = json.loads((out / sweep.PROVENANCE).read_text())
    prov["device"]["name"] = "NVIDIA H200"
    (out / sweep.PROVENANCE).write_text(json.dumps(prov))
    results, before = (out / sweep.RESULTS).read_bytes(), (out / sweep.PROVENANCE).read_bytes()
    with open(out / sweep.RESULTS, "ab") as f:
        f.write(b"half a li")  # a crash's partial line: a refused resume does not repair it either
    with pytest.raises(ParamsError, match=r"^params key 'out_dir': value '.*' holds a run measured on 'NVIDIA H200', "
                                          r"this is '.+': use another out_dir$"):
        sweep.run(params, out, progress=False)
    assert (out / sweep.RESULTS).read_bytes() == results + b"half a li"
    assert (out / sweep.PROVENANCE).read_bytes() == before


def test_a_killed_sweep_loses_no_finished_row(tmp_path):
    out, params = tmp_path / "run", tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({**TINY, "builds": ["fused", "torch_eager"]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli", "sweep", "--params", str(params), "--out",
                             str(out), "--quiet"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    results, deadline = out / sweep.RESULTS, time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 3:  # header + 2 rows
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = sweep.read_results(out)
    assert 2 <= len(kept) < 8 and kept["status"].eq("ok").all()
    assert json.loads((out / sweep.PROVENANCE).read_text())["ended"] is None  # it never finished, and says so
    df = sweep.run({**TINY, "builds": ["fused", "torch_eager"]}, out, progress=False)
    assert len(df) == 8 and df["case_id"].is_unique
    assert df.iloc[: len(kept)].equals(kept)


def test_oom_and_error_rows_and_the_sweep_goes_on(tmp_path, monkeypatch):
    def hungry(q, k, v, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB.")

    def broken(q, k, v, **kw):
        raise ValueError("a bug in this build")

    for name, fn in (("hungry", hungry), ("broken", broken)):
        monkeypatch.setitem(builds.BUILDS, name, Build(name, fn, "library", name, None, "test"))
        monkeypatch.setitem(cost.HOLDS, name, "S+P")
    df = sweep.run({**TINY, "builds": ["hungry", "broken", "fused"]}, tmp_path / "run", progress=False)
    assert len(df) == N_CASES
    by = df.groupby("build")["status"]
    assert set(by.get_group("hungry")) == {"oom: 3221225472 bytes wanted (the failed allocation)"}
    assert set(by.get_group("broken")) == {"error: ValueError: a bug in this build"}
    assert set(by.get_group("fused")) == {"ok"}


def test_a_failure_of_measure_itself_is_an_error_row(tmp_path, monkeypatch):
    real = m.measure

    def flaky(case, **kw):
        if case.N == 32 and case.build == "fused":
            raise RuntimeError("measure broke")
        return real(case, **kw)

    monkeypatch.setattr(m, "measure", flaky)
    df = sweep.run({**TINY, "builds": ["fused"]}, tmp_path / "run", progress=False)
    assert list(df["status"]) == ["error: RuntimeError: measure broke", "ok"] * 2
    assert list(df.columns) == list(COLUMNS) and (df["flops"] > 0).all()


# -- params -------------------------------------------------------------------------------------------------------

BAD = [
    ({"colour": "red"}, "params key 'colour': value 'red' is not a params key"),
    ({"builds": ["fused", "nope"]}, "params key 'builds': value 'nope' is not a build"),
    ({"seq_lens": [64, -1]}, "params key 'seq_lens': value -1 must be > 0"),
    ({"seq_lens": [0]}, "params key 'seq_lens': value 0 must be > 0"),
    ({"seq_lens": [64.5]}, "params key 'seq_lens': value 64.5 must be an integer"),
    ({"head_dims": [512]}, "params key 'head_dims': value 512 must be <= 256"),
    ({"dtype": "float64"}, "params key 'dtype': value 'float64' must be one of bfloat16, float16, float32"),
    ({"causal": ["yes"]}, "params key 'causal': value ['yes'] must be a list of booleans"),
    ({"device": "tpu"}, "params key 'device': value 'tpu' must be 'auto', 'cpu', 'cuda' or 'cuda:<index>'"),
    ({"batch_policy": "random"}, "params key 'batch_policy': value 'random' must be one of fixed_tokens, fixed"),
    ({"tokens": 1024}, "params key 'tokens': value 1024 belongs to batch_policy 'fixed_tokens', not 'fixed'"),
    ({"reps_ms": 0}, "params key 'reps_ms': value 0 must be > 0"),
    ({"group": 3}, "params key 'group': value 3 must divide the number of query heads, got H=2"),
]


@pytest.mark.parametrize("change, message", BAD)
def test_bad_params_name_the_key_and_value_and_write_nothing(tmp_path, change, message):
    out = tmp_path / "never"
    with pytest.raises(ParamsError) as e:
        sweep.run({**TINY, **change}, out)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not out.exists()


def test_missing_and_policy_keys(tmp_path):
    p = {k: v for k, v in TINY.items() if k != "seq_lens"}
    with pytest.raises(ParamsError, match="^params key 'seq_lens': is required$"):
        sweep.validate(p)
    ft = {**{k: v for k, v in TINY.items() if k not in ("batch", "heads")}, "batch_policy": "fixed_tokens"}
    with pytest.raises(ParamsError, match="^params key 'tokens': is required by batch_policy 'fixed_tokens'$"):
        sweep.validate(ft)
    with pytest.raises(ParamsError, match="^params key 'tokens': value 32 must be >= every seq_len"):
        sweep.validate({**ft, "tokens": 32, "width": 32})
    with pytest.raises(ParamsError, match="^params key 'width': value 40 must be a multiple of every head_dim"):
        sweep.validate({**ft, "tokens": 128, "width": 40})


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_device_that_is_not_here(tmp_path):
    with pytest.raises(ParamsError, match="^params key 'device': value 'cuda' needs a CUDA GPU"):
        sweep.run({**TINY, "device": "cuda"}, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_bad_files_and_out_dirs(tmp_path):
    with pytest.raises(ParamsError, match="^params file '.*missing.yaml': cannot be read: No such file"):
        sweep.load_params(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("seq_lens: [64, 128\n")
    with pytest.raises(ParamsError, match="^params file '.*broken.yaml': is not valid YAML at line"):
        sweep.load_params(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ParamsError, match="must hold a mapping of params keys, got list"):
        sweep.load_params(listed)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("dtype: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ParamsError, match="is not valid YAML"):  # safe_load: no object construction
        sweep.load_params(unsafe)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ParamsError, match=f"^params key 'out_dir': value '{a_file}' is a file, not a directory$"):
        sweep.run(TINY, a_file)
    with pytest.raises(ParamsError, match="cannot be created: .* is a file"):
        sweep.run(TINY, a_file / "below")
    assert a_file.read_text() == "x"


def test_policies_expand_like_flashattention_benchmarks():
    p = sweep.validate({**{k: v for k, v in TINY.items() if k not in ("batch", "heads")},
                        "batch_policy": "fixed_tokens", "tokens": 1024, "width": 64, "seq_lens": [128, 256],
                        "head_dims": [16, 32], "group": 2, "builds": "all"})
    cases = sweep.grid(p, "cpu")
    assert len(cases) == 2 * 2 * 2 * len(builds.BUILDS)
    for c in cases:
        assert c.B * c.N == 1024 and c.H * c.D == 64 and c.H == 2 * c.Hkv
    assert [c.N for c in cases[: 2 * len(builds.BUILDS): len(builds.BUILDS)]] == [128, 256]  # N ascending


@pytest.mark.parametrize("path", sorted((ROOT / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_params_files_load_and_expand_to_their_own_grid(path):
    """Every params file the repository ships validates, and its grid is every (causal, D, N, build) of its own
    values once, each shape sized by its batch policy."""
    p = sweep.load_params(path)
    cases = sweep.grid(p, "cpu")
    assert len(cases) == len(p["causal"]) * len(p["head_dims"]) * len(p["seq_lens"]) * len(p["builds"])
    assert len({c.case_id for c in cases}) == len(cases)
    assert {(c.causal, c.D, c.N, c.build) for c in cases} == {
        (c, d, n, b) for c in p["causal"] for d in p["head_dims"] for n in p["seq_lens"] for b in p["builds"]}
    for c in cases:
        if p["batch_policy"] == "fixed_tokens":
            assert c.B == p["tokens"] // c.N and c.H == p["width"] // c.D
        else:
            assert (c.B, c.H) == (p["batch"], p["heads"])
        assert c.H == p["group"] * c.Hkv


def test_the_cpu_params_measure_our_builds_on_the_cpu_and_the_gpu_ones_every_build():
    """What `attnlab run` sweeps (cli.params_for): the CPU run measures our three builds there; a GPU run every
    build the lab has. A variant a user names with --params (a stem with a '-', e.g. h200-fixed-bh.yaml) is never
    picked for a device, and may measure fewer."""
    from attnlab import cli

    cpu = sweep.load_params(ROOT / "params" / "cpu.yaml")
    assert cpu["device"] == "cpu" and set(builds.OURS) <= set(cpu["builds"])
    picked = set((ROOT / "params").glob("*.yaml")) - {ROOT / "params" / "cpu.yaml"}
    for gpu in (f for f in picked if "-" not in f.stem):
        assert sweep.load_params(gpu)["builds"] == builds.names(), gpu.name
        assert cli.params_for(f"NVIDIA {gpu.stem.upper()}", ROOT / "params")[0] in (gpu, ROOT / "params" / "gpu.yaml")
    for variant in (f for f in picked if "-" in f.stem):
        assert cli.params_for(f"NVIDIA {variant.stem.upper()}", ROOT / "params")[0] != variant
        assert set(builds.OURS) <= set(sweep.load_params(variant)["builds"])


def test_families_and_all_expand_to_build_names():
    p = sweep.validate({**TINY, "builds": ["ours", "fused", "torch_eager"]})
    assert p["builds"] == ["materialised", "qk_softmax", "fused", "torch_eager"]
    assert sweep.validate({**TINY, "builds": "all"})["builds"] == builds.names()


def test_results_of_another_schema_are_not_resumed(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / sweep.RESULTS).write_text("run_id,case_id,ms\nx,y,1.0\n")
    with pytest.raises(ParamsError, match="cannot be resumed: .* columns of another schema"):
        sweep.run(TINY, out)
    assert not (out / sweep.PROVENANCE).exists()


def test_results_written_before_the_clock_columns_read_but_are_not_appended_to(tmp_path):
    """Runs measured before schema.LATER's columns (sm_clock_mhz, power_w, clock_reasons) existed still render:
    those columns read as unknown. A sweep does not add rows of the whole schema to such a file."""
    from attnlab.schema import LATER

    out = tmp_path / "run"
    df = sweep.run({**TINY, "builds": ["fused"], "seq_lens": [32]}, out)
    assert df.sm_clock_mhz.isna().all() and (df.clock_reasons == "").all()  # a CPU: nothing to sample
    old = df.drop(columns=list(LATER))
    old.to_csv(out / sweep.RESULTS, index=False)
    back = sweep.read_results(out)
    assert list(back.columns) == list(COLUMNS) and back.sm_clock_mhz.isna().all() and len(back) == len(df)
    assert back.ms.tolist() == pytest.approx(df.ms.tolist())
    lacking = r"columns of another schema \(\['clock_reasons', 'eager_ms', 'power_w', 'sm_clock_mhz'\] differ\)"
    old.iloc[:0].to_csv(out / sweep.RESULTS, index=False)  # its case left to measure
    with pytest.raises(ParamsError, match="cannot be resumed: .* " + lacking):
        sweep.run({**TINY, "builds": ["fused"], "seq_lens": [32]}, out)


def test_a_finished_run_of_an_older_schema_resumes_with_nothing_to_measure_and_its_file_untouched(tmp_path):
    """A run of record written before the backward pass's columns renders again (attnlab run over its folder): with
    every case measured, the resume appends nothing, so the older file is read, kept byte for byte, and returned."""
    from attnlab import schema

    out = tmp_path / "run"
    p = {**TINY, "builds": ["fused"], "seq_lens": [32]}
    df = sweep.run(p, out)
    df.drop(columns=list(schema.BEFORE_BACKWARD)).to_csv(out / sweep.RESULTS, index=False)
    before = (out / sweep.RESULTS).read_bytes()
    again = sweep.run(p, out)
    assert (out / sweep.RESULTS).read_bytes() == before
    assert again.case_id.tolist() == df.case_id.tolist() and (again["pass"] == "forward").all()
    df.drop(columns=list(schema.BEFORE_BACKWARD)).iloc[:0].to_csv(out / sweep.RESULTS, index=False)
    with pytest.raises(ParamsError, match=r"cannot be resumed: .* \(\['held_bytes', 'pass'\] differ\)"):
        sweep.run(p, out)  # a case left to measure: not appended to the older file


def test_results_with_the_clock_columns_but_not_the_eager_time_read_too(tmp_path):
    """A run of record measured before eager_ms existed, with the clock columns, reads with eager_ms unknown; a file
    missing a column that is not one of LATER's, or with the columns out of order, is refused."""
    out = tmp_path / "run"
    df = sweep.run({**TINY, "builds": ["fused"], "seq_lens": [32]}, out)
    df.drop(columns=["eager_ms"]).to_csv(out / sweep.RESULTS, index=False)
    back = sweep.read_results(out)
    assert list(back.columns) == list(COLUMNS) and back.eager_ms.isna().all() and len(back) == len(df)
    df.drop(columns=["eager_ms", "err"]).to_csv(out / sweep.RESULTS, index=False)
    with pytest.raises(ValueError, match="columns of another schema"):
        sweep.read_results(out)
    df[list(reversed(df.columns))].to_csv(out / sweep.RESULTS, index=False)
    with pytest.raises(ValueError, match="columns of another schema"):
        sweep.read_results(out)


def test_read_results_of_an_empty_run_is_typed(tmp_path):
    df = sweep.read_results(tmp_path / "nothing.csv")
    assert list(df.columns) == list(COLUMNS) and df.empty and df["causal"].dtype == bool


def test_clock_readings_fall_back_to_the_plain_clocks_when_a_field_is_refused(monkeypatch):
    """An older driver rejects clocks_event_reasons.active, and nvidia-smi then answers nothing for the query."""
    from attnlab import provenance

    def fake(device, fields=provenance.CLOCK_FIELDS):
        if "clocks_event_reasons.active" in fields:
            return {**{f: None for f in fields}, "note": "nvidia-smi --query-gpu=...: exit 2: Field not valid"}
        return {**{f: "1" for f in fields}, "note": ""}

    monkeypatch.setattr(provenance, "gpu_clocks", fake)
    got = sweep._clocks("cuda:0")
    assert got["clocks.sm"] == "1" and "Field not valid" in got["note"]
    assert sweep._clocks("cpu") == {}
