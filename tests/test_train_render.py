"""notebooks/training.ipynb rendered by papermill twice on a CPU: down its GPU path, its rows from the stand-in GPU of
tests/standin/training.py (installed in the kernel by tests/standin/sitecustomize.py), whose numbers are known, so
every section must show them; then down its CPU path, our kernels in Triton's interpreter at one tiny shape, where the
gradients come from this run and the speed and memory from the stand-in's run, found as the newest committed GPU
training run. Both pages keep the page budget."""
from pathlib import Path

import nbformat
import pytest
import yaml

from attnlab import cost, hf_attention, train_lab, train_sweep
from attnlab.measure import Case
from tests import page_budget
from tests.standin import installed
from tests.standin import training as standin

GPU = dict(name="standin", device="cpu", dtype="bfloat16", seq_lens=[1024, 2048, 4096], head_dims=[64],
           causal=[False, True], batch_policy="fixed_tokens", tokens=16384, width=2048,
           builds=["fused", "qk_softmax", "materialised", "sdpa_cudnn", "sdpa_flash", "torch_eager"],
           passes=["forward", "backward", "forward+backward"], warmup_ms=0, reps_ms=1, min_reps=1,
           model_step=dict(model=dict(name="llama-2k", layers=4, hidden=2048, heads=16, kv_heads=4, head_dim=128,
                                      intermediate=8192, vocab=32000), batch=1, seq_len=2048,
                           builds=["materialised", "qk_softmax", "fused", "torch_eager"]))
CPU = dict(name="tiny", device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[True],
           batch_policy="fixed", batch=1, heads=2, builds=["materialised", "fused"], passes=["forward+backward"],
           warmup_ms=0, reps_ms=1, min_reps=1)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The stand-in GPU's render (a committed GPU run, under outputs/), then the CPU's, which reads it."""
    tmp = tmp_path_factory.mktemp("training")
    outputs = tmp / "outputs"
    for name, params in (("gpu", GPU), ("cpu", CPU)):
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(params))
    with installed("tests.standin.training", ATTNLAB_OUTPUTS=str(outputs)):
        gpu = train_lab.render_notebook(tmp / "gpu.yaml", outputs / "stand-in" / "run")
    with pytest.MonkeyPatch.context() as env:  # the kernel inherits this process's environment
        env.setenv("ATTNLAB_OUTPUTS", str(outputs))
        cpu = train_lab.render_notebook(tmp / "cpu.yaml", tmp / "cpu-run")
    return gpu, cpu


def _page(rendered) -> tuple[str, list, object]:
    """What the executed notebook shows (page_budget.page), and the notebook."""
    nb = nbformat.read(str(rendered.notebook), as_version=4)
    return (*page_budget.page(nb), nb)


def _shape(build: str, N: int) -> Case:
    return Case(build, 16384 // N, 32, 32, N, 64, "bfloat16", False)


def test_the_gpu_path_shows_the_stand_ins_numbers_in_every_section(pages):
    gpu, _ = pages
    assert gpu.code == 0, gpu.message
    rows = train_sweep.read_results(gpu.out)
    assert len(rows) == 6 * 3 * 3 * 2 and set(rows["device"]) == {"cuda:0"}
    text, figures, _ = _page(gpu)
    assert f"Measured here:** this run, measured on {standin.DEVICE_NAME}" in text
    assert "From a committed GPU run" not in text and "interpreter" not in text.split("## ")[0]
    # the speedup: the prediction from the ceilings at N = 2048 (materialised's last N), then the rows
    mat, fused = _shape("materialised", 2048), _shape("fused", 2048)
    moved = cost.bytes_moved(mat) + cost.backward_bytes(mat)
    flops = cost.flops(fused) + cost.backward_flops(fused)
    predicted = (moved / standin.CEILINGS["tbps"]) / (flops / standin.CEILINGS["tflops"])
    assert f"fused {predicted:.2f}× faster if each ran at its ceiling" in text
    assert f"at D = 64, N = 2048, 3.60× (predicted {predicted:.2f}×)" in text
    assert "0.95× cuDNN's speed (sdpa_cudnn, 6 shapes); 1.42× FlashAttention-2's speed (sdpa_flash, 6 shapes)" in text
    assert "materialised's forward+backward ran out of memory from N = 4096 at D = 64: the curve stops there" in text
    assert page_budget.trace(figures, "forward+backward: speedup", "fused") == pytest.approx([3.1, 3.6])
    assert page_budget.trace(figures, "forward+backward: speedup", "sdpa_flash", "x2") == pytest.approx([3.1 / 1.42, 3.6 / 1.42])
    # memory held: the stand-in's held bytes over the model's, and the two model lines
    p4096, lse4096 = cost.saved_bytes(_shape("materialised", 4096)), cost.saved_bytes(_shape("fused", 4096))
    assert f"P is 4 GiB and the logsumexp 2 MiB, {p4096 // lse4096:,}× less" in text
    assert "P alone would fill this card's 80 GiB at N ≈ 81,920" in text
    assert "torch_eager 3 GiB at N = 2048 (1.50× its P)" in text and "fused 2 MiB at N = 4096 (1.00× its logsumexp)" in text
    assert "Out of memory in forward+backward: materialised from N = 4096 at D = 64; torch_eager from N = 4096" in text
    p = [cost.saved_bytes(_shape("materialised", n)) for n in (1024, 2048, 4096)]
    assert page_budget.trace(figures, "Memory held", "torch_eager") == pytest.approx([1.5 * p[0], 1.5 * p[1]])
    assert page_budget.trace(figures, "Memory held", "model: P, B·H·N² elements") == pytest.approx(p)
    # the recompute trade: 1.5·E·R/D at every N, and the backward passes measured
    ratio = 1.5 * 2 * standin.CEILINGS["tflops"] / standin.CEILINGS["tbps"] / 64
    assert f"moving P takes 1.5·E·R/D times as long as recomputing it: {ratio:.3g}× at D = 64" in text
    recompute = [cost.recompute_flops(_shape("fused", n)) / (standin.CEILINGS["tflops"] * 1e9) for n in (1024, 2048, 4096)]
    assert page_budget.trace(figures, "The recompute trade", "recompute S (extra FLOPs), D = 64") == pytest.approx(recompute)
    back = {b: standin.ms(b, 4096, False, "backward") for b in ("fused", "qk_softmax")}
    assert (f"fused's backward, which recomputes, takes {back['fused']:.3g} ms and qk_softmax's, which reads P, "
            f"{back['qk_softmax']:.3g} ms") in text
    # check yourself
    assert f"{ratio:.3g}× longer" in text and "asking for 48 GiB more" in text
    # the real model's step: every build within the rule, fused's peak against materialised's
    if not hf_attention.available():  # the sweep leaves the step out, and the page says why
        assert "not measured in this run (transformers is not installed" in text
        return
    assert "Rows: this run, `" in text and "model_train.csv" in text
    assert "Against transformers' SDPA path (llama-2k, B = 1, N = 2048, bfloat16), 5 of 5 builds give its loss" in text
    assert "A step with materialised peaks at 1.6 GiB above the weights" in text and "fused saves 614 MiB" in text
    assert page_budget.trace(figures, "One training step of llama-2k", "fused") == pytest.approx([2 ** 30])


def test_the_cpu_path_shows_its_own_gradients_and_the_committed_runs_speed_and_memory(pages):
    gpu, cpu = pages
    assert cpu.code == 0, cpu.message
    rows = train_sweep.read_results(cpu.out)
    assert list(rows["status"]) == ["ok", "ok"] and set(rows["device"]) == {"cpu"}
    text, _, _ = _page(cpu)
    assert "2 of 2 (build, pass) pairs that ran are within the accuracy rule" in text
    assert "These rows were measured on a CPU, our Triton kernels in Triton's interpreter" in text
    assert "Correctness from this run; speed and memory from a committed GPU run, not from this machine" in text
    assert text.count("Rows: from a committed GPU run, not from this machine: the committed run") >= 3
    assert f"measured on {standin.DEVICE_NAME}" in text and "at D = 64, N = 2048, 3.60×" in text
    assert "Measured here" not in text
    # the real model's step: this run's params name none, so the committed run's is shown
    if not hf_attention.available():
        return
    assert text.count("Rows: from a committed GPU run, not from this machine: the committed run") == 4
    assert "fused saves 614 MiB" in text


def test_both_pages_keep_the_page_budget_with_no_bar_frozen_part_way(pages):
    for rendered in pages:
        _, _, nb = _page(rendered)
        assert len(page_budget.expanded_tables(nb)) <= page_budget.BUDGET_TABLES, page_budget.expanded_tables(nb)
        assert page_budget.generated_words(nb) <= page_budget.BUDGET_WORDS, page_budget.words_by_cell(nb)
        assert page_budget.noise(nb) == [] and page_budget.repeated_notes(nb) == []
        assert Path(rendered.html).exists()


def test_the_model_and_training_pages_keep_their_own_params_in_a_shared_folder(tmp_path):
    """Each page writes its params under its own name (model_params.yaml, train_params.yaml), never the walkthrough's
    params.yaml: a folder that holds two pages keeps what each one ran with."""
    from attnlab import model_lab, model_sweep, train_lab, train_sweep

    root = Path(__file__).resolve().parent.parent / "params"
    out = tmp_path / "run"
    model = {**model_sweep.load_params(root / "model" / "cpu.yaml"), "out_dir": str(out)}
    train = {**train_sweep.load_params(root / "training" / "cpu.yaml"), "out_dir": str(out)}
    model_lab.begin(model)
    train_lab.begin(train)
    assert sorted(p.name for p in out.glob("*.yaml")) == ["model_params.yaml", "train_params.yaml"]
    assert yaml.safe_load((out / model_sweep.PARAMS).read_text())["name"] == model["name"]
    assert yaml.safe_load((out / train_sweep.PARAMS).read_text())["name"] == train["name"]
