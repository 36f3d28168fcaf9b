"""The correctness gate as a user runs it (`attnlab check`), on the CPU with Triton's interpreter."""
import pandas as pd
import pytest
import torch

from attnlab import builds, gate
from attnlab.builds import Build
from tests.conftest import out_of_memory_once


def test_gate_passes_correct_builds_and_writes_every_row(tmp_path, capsys):
    out = tmp_path / "gate.csv"
    code = gate.main(["--device", "cpu", "--quick", "--builds", "torch_eager,fused", "--dtypes", " float32",
                      "--out", str(out)])
    rows = pd.read_csv(out)
    assert code == 0
    assert set(rows.build) == {"torch_eager", "fused"} and set(rows.dtype) == {"float32"}
    assert len(rows) == 2 * len([c for c in gate.grid(torch.device("cpu"), quick=True) if c.dtype == "float32"])
    assert (rows.status == "ok").all() and (rows.err < rows.limit).all() and (rows.unwritten == 0).all()
    assert "gate: 8 passed, 0 failed" in capsys.readouterr().out


def test_gate_fails_a_wrong_build(monkeypatch, tmp_path, capsys):
    """A build off by a little more than the rule allows must fail the gate (exit 1), with its row kept."""
    eager = builds.get("torch_eager")
    wrong = Build("torch_eager", lambda q, k, v, **kw: eager.attend(q, k, v, **kw) * 1.05, "library", "torch_eager",
                  None, "torch eager, 5 % off")
    monkeypatch.setattr(builds, "get", lambda name: wrong if name == "torch_eager" else eager)
    out = tmp_path / "gate.csv"
    code = gate.main(["--device", "cpu", "--quick", "--builds", "torch_eager", "--dtypes", "float32",
                      "--out", str(out)])
    assert code == 1
    assert (pd.read_csv(out).status == "FAIL").all()
    assert "FAIL torch_eager" in capsys.readouterr().out


def test_an_oracle_out_of_memory_is_the_oracles_row_not_the_builds(monkeypatch, tmp_path, capsys):
    """The fp64 oracle of one shape not fitting makes that shape's rows "oom: the fp64 oracle", skipped, not the
    build's "oom" (the gradient gate's words for the same); the shapes after it are judged."""
    from attnlab import reference

    out_of_memory_once(monkeypatch, reference, "attend")
    out = tmp_path / "gate.csv"
    assert gate.main(["--device", "cpu", "--quick", "--builds", "torch_eager,fused", "--dtypes", "float32", "--out",
                      str(out)]) == 0
    rows = pd.read_csv(out)
    first = rows[rows["shape"] == rows["shape"].min()]
    assert list(first.status) == ["oom: the fp64 oracle"] * 2 and first.err.isna().all()
    assert (rows[rows["shape"] != rows["shape"].min()].status == "ok").all()
    assert "gate: 6 passed, 0 failed, 2 skipped" in capsys.readouterr().out


def test_our_builds_are_judged_on_a_repeated_call_that_must_equal_the_first(monkeypatch, tmp_path, capsys):
    fused = builds.get("fused")
    calls = []

    def drifts(q, k, v, **kw):  # the second call one ulp off: within the limit, yet not the first call's bits
        o = fused.attend(q, k, v, **kw)
        calls.append(q.shape)
        return o if len(calls) % 2 else o.copy_(torch.nextafter(o, torch.full_like(o, float("inf"))))

    monkeypatch.setattr(builds, "get", lambda name: Build("fused", drifts, "ours", "fused", None, "drifts"))
    out = tmp_path / "gate.csv"
    code = gate.main(["--device", "cpu", "--quick", "--builds", "fused", "--dtypes", "float32", "--out", str(out)])
    rows = pd.read_csv(out)
    assert code == 1 and len(calls) == 2 * len(rows)  # a first call and the judged one
    assert (rows.status == "FAIL: a repeated call differs from the first").all()
    assert (rows.err < rows.limit).all()  # each output alone is within the limit: only the repeat check fails it


def test_jobs_share_the_shapes_and_write_the_rows_one_process_writes(tmp_path, capsys, monkeypatch):
    """`--jobs 2`: two processes, each its share of the shapes with the seed one process gives it, so the merged rows
    (errors included) are the single process's, in its order. Every process runs its matrix products on one thread:
    with more, MKL may pick its thread count by the machine's load, and a product's summation order with it, so the
    last bits of an fp32 error would depend on what else the machine runs."""
    argv = ["--device", "cpu", "--quick", "--builds", "torch_eager,fused", "--dtypes", "float32"]
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # the children's
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this process's
    try:
        assert gate.main([*argv, "--out", str(tmp_path / "one.csv")]) == 0
        assert gate.main([*argv, "--jobs", "2", "--out", str(tmp_path / "two.csv")]) == 0
    finally:
        torch.set_num_threads(threads)
    one, two = pd.read_csv(tmp_path / "one.csv"), pd.read_csv(tmp_path / "two.csv")
    assert list(two["shape"]) == sorted(two["shape"]) and len(two) == len(one) == 8
    cols = ["build", "shape", "N", "D", "causal", "status", "err"]
    assert two[cols].equals(one[cols]), pd.concat([one[cols], two[cols]], axis=1, keys=["one", "two"]).to_string()
    assert "2 processes" in capsys.readouterr().out


def test_a_process_that_dies_fails_the_shapes_it_had_left():
    """A child that exits before writing its rows (here: a dtype its grid lacks, exit 2) leaves one FAIL row per
    shape it owned, naming the part and its exit status; nothing is silently missing."""
    rows = gate.in_parallel(["--device", "cpu", "--quick", "--dtypes", "float64"], jobs=2, owners=[0, 1, 0])
    assert [r["shape"] for r in rows] == [0, 1, 2]
    assert all(r["status"].startswith("FAIL: part") and "exited with 2" in r["status"] for r in rows)
    assert [r["status"].split()[2] for r in rows] == ["0/2", "1/2", "0/2"]


@pytest.mark.parametrize("argv, says", [
    (["--builds", "nope"], "--builds"),
    (["--dtypes", "float64"], "argument --dtypes: expected dtypes from bfloat16, float16, float32"),
    (["--part", "2/2"], "--part: expected 0 <= K < J"),
    (["--part", "half"], "--part: expected K/J"),
    (["--jobs", "0"], "argument --jobs: expected a whole number >= 1, got '0'"),
    (["--jobs", "2", "--part", "0/2"], "no --part with it"),
    (["--ns", "0"], "argument --ns: expected whole numbers >= 1, comma-separated, got '0'"),
    (["--ns", "-5"], "argument --ns: expected whole numbers >= 1"),
    (["--ns", "abc"], "argument --ns: expected whole numbers >= 1"),
    (["--ns", ""], "argument --ns: expected whole numbers >= 1"),
    (["--device", "tpu"], "argument --device: must be one of auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["--device", "cuda:x"], "argument --device: must be one of auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    (["--device", "cpu:0"], "argument --device: must be one of auto, cpu, cuda or cuda:N, got 'cpu:0'"),
    (["--tiles", "/missing.json"], "argument --tiles: no such file: '/missing.json'"),
    (["--out", "/no/such/folder/gate.csv"], "argument --out: the folder '/no/such/folder' of"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys):
    assert gate.main(["--device", "cpu", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and err.startswith("attnlab check: error: ")


def test_a_tiles_file_that_is_not_an_autotune_result_is_refused_before_any_case(tmp_path, capsys):
    bad = tmp_path / "tiles.json"
    bad.write_text('{"not": "a list of entries"}')
    assert gate.main(["--device", "cpu", "--quick", "--tiles", str(bad)]) == 2
    err = capsys.readouterr()
    assert f"{bad} is not a tiles.json written by attnlab bench --autotune" in err.err
    assert "correctness gate on" not in err.out  # refused before the gate started


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the machine has a GPU")
def test_asking_for_a_gpu_on_a_machine_without_one_is_one_line(capsys):
    assert gate.main(["--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == ("attnlab check: error: argument --device: cuda was asked for, but "
                                               "torch sees no CUDA GPU on this machine")


def test_a_numbered_gpu_is_the_form_the_lab_hands_its_gate_processes(monkeypatch, capsys):
    """The walkthrough's gate passes str(run.device), 'cuda:0', to its `attnlab check` processes: the parser takes
    it, and a number past the GPUs torch sees is one line naming how many it sees."""
    from attnlab import args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert args.device(str(torch.device("cuda", 0))) == "cuda:0" and args.device("cuda:1") == "cuda:1"
    assert args.device("cuda") == "cuda"
    assert gate.main(["--device", "cuda:2", "--quick"]) == 2
    assert capsys.readouterr().err.strip() == ("attnlab check: error: argument --device: cuda:2 was asked for, but "
                                               "torch sees 2 CUDA GPU(s) on this machine")


def test_the_gpu_grid_is_dealt_by_family():
    """Shapes of one (dtype, D, causal) compile the same variants, so one part checks them all; with 8 parts the
    46 shapes' longest part has 7 (dealing i % 8 split every family in two, by N's parity)."""
    cases = gate.grid(torch.device("cuda"))
    assert len(cases) == 46
    for jobs in (1, 4, 8):
        owners = gate.deal(cases, jobs)
        assert set(owners) == set(range(jobs))
        by_family = {}
        for c, k in zip(cases, owners):
            assert by_family.setdefault(gate.family(c), k) == k
    owners = gate.deal(cases, 8)
    assert max(owners.count(k) for k in range(8)) == 7
    assert gate.deal(cases, 4)[:32] == [i % 4 for i in range(32)]  # the main grid as before, at 4


def test_a_part_checks_the_shapes_deal_gives_it(capsys):
    argv = ["--device", "cpu", "--quick", "--builds", "torch_eager", "--dtypes", "float32"]
    cases = [c for c in gate.grid(torch.device("cpu"), quick=True) if c.dtype == "float32"]
    owners = gate.deal(cases, 2)
    assert gate.main([*argv, "--part", "1/2"]) == 0
    out = capsys.readouterr().out
    assert f"gate: {owners.count(1)} passed" in out and owners.count(1) < len(cases)


def test_the_gates_processes_follow_the_cores():
    """One process a pair of cores on a GPU machine, at least JOBS_MIN, at most JOBS_MAX."""
    assert [gate.default_jobs(c) for c in (1, 8, 10, 16, 32, 128)] == [4, 4, 5, 8, 8, 8]
    assert gate.JOBS_MIN <= gate.default_jobs() <= gate.JOBS_MAX



def test_cases_from_a_file_are_checked_in_its_order_and_a_bad_file_is_one_line(tmp_path, capsys):
    import json

    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([dict(B=1, H=2, Hkv=1, N=24, D=16, dtype="float32", causal=True)]))
    out = tmp_path / "gate.csv"
    assert gate.main(["--device", "cpu", "--cases", str(cases), "--builds", "fused,torch_eager", "--out",
                      str(out)]) == 0
    rows = __import__("pandas").read_csv(out)
    assert rows[["shape", "N", "Hkv", "causal"]].drop_duplicates().values.tolist() == [[0, 24, 1, True]]
    assert (rows["status"] == "ok").all() and len(rows) == 2
    capsys.readouterr()
    cases.write_text(json.dumps([dict(B=1, H=2, N=24)]))
    assert gate.main(["--device", "cpu", "--cases", str(cases)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab check: error: argument --cases:") and "KeyError" in err and "\n" not in err
    assert gate.main(["--device", "cpu", "--cases", str(cases), "--ns", "64"]) == 2
    assert "--cases names the shapes itself" in capsys.readouterr().err
