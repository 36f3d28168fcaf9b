"""attnlab.warm: our builds run once per shape of a params grid in child processes, so that Triton's cache is full
before the sweep (its time on a GPU is not asserted)."""
from pathlib import Path

import pytest

from attnlab import builds, sweep, warm

PARAMS = """name: warm-test
device: cpu
dtype: float32
seq_lens: [16, 24]
head_dims: [16]
causal: [false, true]
batch_policy: fixed
batch: 1
heads: 2
builds: [ours, ablation, torch_eager]
warmup_ms: 0
reps_ms: 1
min_reps: 1
"""


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PARAMS)
    return str(path)


def test_the_parts_cover_our_cases_once_and_spread_every_build(params):
    ours = warm.cases(params)
    assert ours and all(builds.get(c.build).family != "library" for c in ours)
    assert len(ours) == len([c for c in sweep.grid(sweep.load_params(params), "cpu") if c.build != "torch_eager"])
    for jobs in (2, 3):
        parts = [warm.mine(ours, k, jobs) for k in range(jobs)]
        assert sorted((c.case_id for p in parts for c in p)) == sorted(c.case_id for c in ours)
    parts = [warm.mine(ours, k, 2) for k in range(2)]
    for p in parts:  # two families (causal or not) for two children: each child gets each build in one of them
        assert {c.build for c in p} == {c.build for c in ours}


def test_a_builds_family_is_compiled_in_one_child():
    """One build's cases that differ only by N (and B) compile the same kernel variants: one child gets them all, so
    two children never compile one variant at once (a deal by shape would send one family to several)."""
    h200 = Path(__file__).resolve().parents[1] / "params" / "h200.yaml"
    p = dict(sweep.load_params(h200), device="cpu")  # the H200 grid's cases, without a GPU
    ours = [c for c in sweep.grid(p, "cpu") if builds.get(c.build).family != "library"]
    mine = [b for b in p["builds"] if builds.get(b).family != "library"]
    assert len(ours) == len(mine) * len(p["head_dims"]) * len(p["causal"]) * len(p["seq_lens"]) > 0
    owner = {}
    for k in range(4):
        for c in warm.mine(ours, k, 4):
            assert owner.setdefault((c.build, c.D, c.causal), k) == k
    assert len(owner) == len(mine) * len(p["head_dims"]) * len(p["causal"])  # every family has its one child
    for k in range(4):  # and every child still gets every build, in one (D, causal) each
        assert sorted(b for b, _, _ in (key for key, o in owner.items() if o == k)) == sorted({c.build for c in ours})


def test_warm_runs_every_case_in_child_processes(params):
    if not __import__("attnlab.triton.config", fromlist=["interpreting"]).interpreting():
        pytest.skip("our kernels run on CPU tensors only under the interpreter")
    lines = warm.warm(params, 2)
    ran = [line for line in lines if line.startswith("warm part")]
    assert len(ran) == 2 and not [line for line in lines if "failed" in line and "0 failed" not in line], lines
    assert sum(int(line.split(": ")[1].split()[0]) for line in ran) == len(warm.cases(params))


def test_bad_arguments_get_one_clear_error(params, capsys):
    assert warm.main(["--params", params, "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert warm.main(["--params", params, "--part", "3/2"]) == 2
    assert "--part" in capsys.readouterr().err
    bad = params.replace("p.yaml", "bad.yaml")
    with open(params) as f, open(bad, "w") as g:
        g.write(f.read().replace("seq_lens: [16, 24]", "seq_lens: [0]"))
    assert warm.main(["--params", bad]) == 2
    assert "seq_lens" in capsys.readouterr().err  # the params' own error, before any child starts


def test_one_triton_cache_for_our_kernels_and_torch_compile(tmp_path):
    """torch._inductor (compiled FlexAttention) points TRITON_CACHE_DIR at a directory of its own when the variable is
    unset, process-wide; our kernels compiled after it would then miss what the warm step compiled. Importing our
    kernels names Triton's own directory first, so inductor's rule (cache_dir_utils.triton_cache_dir, what its
    autotuner sets) and Triton's cache both land there. Checked in a fresh process with the variable unset."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TRITON_HOME")}
    env["HOME"] = str(tmp_path)
    code = ("import json, os, attnlab.triton, triton\n"
            "from torch._inductor.runtime.cache_dir_utils import triton_cache_dir\n"
            "print(json.dumps([os.environ.get('TRITON_CACHE_DIR'), triton.knobs.cache.dir, triton_cache_dir(0)]))")
    env_dir, triton_dir, inductor_dir = json.loads(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        .stdout.strip().splitlines()[-1])
    assert env_dir == triton_dir == inductor_dir == os.path.join(str(tmp_path), ".triton", "cache")
    # and a directory the user names is left alone
    env["TRITON_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [str(tmp_path / "mine")] * 3
