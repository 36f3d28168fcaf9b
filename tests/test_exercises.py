"""notebooks/exercises.ipynb and attnlab.exercises: every reference solution passes its check; every skeleton the
notebook hands the student fails its check with an answer naming the first difference; the checks' inputs catch the
mistakes they are chosen for; and the notebook runs through papermill with the solutions and as committed, without
an error output either way.

The skeletons are read from the notebook's cells tagged `skeleton`, so what is tested is what the student gets.
"""
from __future__ import annotations

import linecache
import math
import os
from pathlib import Path

import nbformat
import pytest
import torch
import triton.language as tl

from attnlab.exercises import Checks, checks, frame, planted, solutions
from attnlab.exercises.verdict import sequence_difference, tensor_difference

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "exercises.ipynb"

# exercise → (the check's method, the names its answer is made of)
EXERCISES = {
    "bytes": ("bytes", ["moved_and_held"]),
    "online_softmax": ("online_softmax", ["online_softmax"]),
    "kernel": ("kernel", ["attend_block"]),
    "causal": ("causal", ["key_blocks", "causal_flops_saved"]),
    "ablation": ("ablation", ["no_softmax"]),
    "lies": ("lies", ["lying_rows"]),
}
SOLUTION = {"lying_rows": "LYING_ROWS"}  # a solution's name where it differs from the notebook's


def code_cells(nb, tag=None):
    return [c for c in nb.cells if c.cell_type == "code" and (tag is None or tag in c.metadata.get("tags", []))]


@pytest.fixture(scope="module")
def skeletons():
    """The names the notebook's setup cell and skeleton cells define, run as the notebook runs them."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    setup = [c for c in code_cells(nb) if "exercises.setup()" in c.source]
    assert len(setup) == 1
    names = {"solutions": False}
    saved = os.environ.get("TRITON_INTERPRET")
    try:
        for i, cell in enumerate(setup + code_cells(nb, "skeleton")):
            name = f"<exercises.ipynb cell {i}>"  # in linecache, as IPython puts a cell: Triton reads a kernel's source
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
            exec(compile(cell.source, name, "exec"), names)
    finally:  # setup() switches the interpreter on for the process; leave the environment as the session had it
        os.environ.pop("TRITON_INTERPRET", None) if saved is None else os.environ.__setitem__("TRITON_INTERPRET", saved)
    return names


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_solution_passes_its_check(exercise):
    method, names = EXERCISES[exercise]
    verdict = getattr(Checks(), method)(*(getattr(solutions, SOLUTION.get(n, n)) for n in names))
    assert verdict.ok, repr(verdict)
    assert repr(verdict).startswith("PASSED")


# What each skeleton's answer must say: the first place it differs, with both values.
FIRST_DIFFERENCE = {
    "bytes": ["first difference: materialised, B=1 H=16 N=4096 D=64 bfloat16 non-causal, bytes moved",
              "expected − yours = 2,147,483,648 B = 4 × one N×N tensor"],
    "online_softmax": ["on random inputs", "first difference at index [", "yours ", ", expected "],
    "kernel": ["non-causal", "first difference at index [0, 0, 0, 0]: yours "],
    "causal": ["query block 0 (rows 0–15): first difference at position 1: yours has 1", "expected [0]"],
    "ablation": ["shape: yours (), expected (1, 8, 512, 64)", "ablation_table flags it",
                 "check that its output is consumed"],
    "lies": ["first difference at row 2 (fused, non-causal): yours 'allocation', expected None"],
}


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_skeleton_fails_its_check_at_the_first_difference(exercise, skeletons):
    method, names = EXERCISES[exercise]
    verdict = getattr(Checks(), method)(*(skeletons[n] for n in names))
    assert not verdict.ok
    text = repr(verdict)
    assert text.startswith("NOT YET")
    for part in FIRST_DIFFERENCE[exercise]:
        assert part in text, text


def test_a_max_taken_from_the_first_tile_passes_random_inputs_and_fails_on_the_last_tile():
    """Why the second input exists: without the running max's rescale, but with the first tile's max held fixed, the
    sum is exact on ordinary scores and overflows only when the largest ones come last."""

    def fixed_max(q, tiles, scale):
        m = l = acc = None
        for k, v in tiles:
            s = (q @ k.T) * scale
            if m is None:
                m, l, acc = s.amax(dim=1), torch.zeros(q.shape[0], dtype=q.dtype), torch.zeros_like(q)
            p = torch.exp(s - m[:, None])
            l, acc = l + p.sum(dim=1), acc + p @ v
        return acc / l[:, None]

    text = repr(Checks().online_softmax(fixed_max))
    assert "on inputs whose row maximum sits in the last key tile" in text and "yours nan" in text, text
    q, k, v = checks.softmax_inputs("last_tile")
    r0, r1 = checks.SOFTMAX_SHAPE["rows"]
    scores = q[r0:r1] @ k.T
    last = (checks.SOFTMAX_SHAPE["N"] - 1) // checks.SOFTMAX_SHAPE["block_n"] * checks.SOFTMAX_SHAPE["block_n"]
    assert (scores.argmax(dim=1) >= last).all()  # the inputs are what they claim


@frame.interpreted_jit
def _ignores_causal(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    return solutions.attend_block(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D, BLOCK_M, BLOCK_N, False)


def test_the_kernel_check_runs_the_causal_case_and_refuses_a_compiled_piece():
    text = repr(Checks().kernel(_ignores_causal))
    assert "\n  causal, B=1 H=2 N=40" in text and "first difference at index [0, 0, 0, 0]" in text, text
    text = repr(Checks().kernel(solutions.online_softmax))  # a plain function: no kernel piece at all
    assert "not a function Triton's interpreter runs" in text


def test_the_causal_check_counts_the_oracles_live_tiles():
    assert checks.live_blocks(100, 32, 16) == {0: [0, 1], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3, 4, 5],
                                               3: list(range(7))}  # rows 96–99 reach key block 6 (96–111)
    text = repr(Checks().causal(solutions.key_blocks, lambda *a: 0))
    assert "causal_flops_saved(B=2, H=4, N=128, D=16, BLOCK_M=32, BLOCK_N=16): yours 0, expected 3,145,728" in text
    assert "12 of 32 tiles skipped" in text and "ideal half would be 4,194,304" in text


def test_the_ablation_check_flags_dead_work_and_an_illegal_program_apart():
    def wrong_program(q, k, v):  # consumed, but P is not S: the softmax kept
        return torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, dim=-1) @ v

    verdict = Checks().ablation(wrong_program)
    assert not verdict.ok
    assert "not the ablated program's O" in repr(verdict) and "raises no dead-work flag" in repr(verdict)


def test_the_lies_check_names_what_it_accepts():
    assert "expected one of ['allocation', 'mixed_ratio', 'timer']" in repr(Checks().lies({4: "causal"}))
    assert "the table has rows 0–9 only" in repr(Checks().lies({**solutions.LYING_ROWS, 12: "timer"}))
    assert "expected a dict" in repr(Checks().lies([4, 5, 6]))
    missing = repr(Checks().lies({5: "timer", 6: "allocation"}))
    assert "first difference at row 4 (fused, causal): yours None, expected 'mixed_ratio'" in missing


def test_the_guards_find_one_lie_of_each_kind_and_follow_the_data(monkeypatch):
    assert {r: lie for r, (lie, _) in planted.found().items()} == {4: "mixed_ratio", 5: "timer", 6: "allocation"}
    honest = [list(r) for r in planted.ROWS]
    honest[4][6] = 3  # fused causal over materialised causal
    honest[5][3] = "do_bench"
    honest[6][5] = 2 * honest[0][5]  # a peak at S + P
    monkeypatch.setattr(planted, "ROWS", [tuple(r) for r in honest])
    assert planted.found() == {}


def test_a_raising_answer_gets_a_verdict_not_a_traceback():
    verdict = Checks().bytes(lambda *a: 1 / 0)
    assert not verdict.ok and "your code raised ZeroDivisionError" in repr(verdict)


def test_differences_name_the_first_index_both_values_and_the_largest():
    expected = torch.zeros(3, 4, dtype=torch.float64)
    yours = expected.clone()
    yours[1, 2], yours[2, 0] = 0.5, math.nan
    text = tensor_difference(yours, expected, rtol=1e-6, atol=1e-9)
    assert text.startswith("first difference at index [1, 2]: yours 0.5, expected 0; 2 of 12 elements differ")
    assert "the largest at [2, 0]: yours nan" in text
    assert tensor_difference(expected, expected, rtol=0, atol=0) is None
    assert tensor_difference(yours[:2], expected, rtol=0, atol=0) == "shape: yours (2, 4), expected (3, 4)"
    assert sequence_difference([0, 1, 3], [0, 1, 2]).startswith("first difference at position 2: yours 3, expected 2")
    assert sequence_difference([0, 1], [0, 1, 2]).startswith("first difference at position 2: expected 2, yours ends")
    assert sequence_difference(range(3), [0, 1, 2]) is None


def test_the_committed_notebook_is_clean_and_shaped_as_the_exercises():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code_cells(nb))
    parameters = code_cells(nb, "parameters")
    assert len(parameters) == 1 and "solutions = False" in parameters[0].source
    cells = nb.cells
    checked = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.startswith("check.")]
    assert len(checked) == len(EXERCISES) == len(code_cells(nb, "skeleton"))
    for i in checked:  # skeleton, then its check, then its hints folded
        assert "skeleton" in cells[i - 1].metadata.get("tags", [])
        assert cells[i + 1].cell_type == "markdown" and cells[i + 1].source.count("<details>") >= 2


@pytest.mark.parametrize("use_solutions", [True, False], ids=["solutions", "skeletons"])
def test_the_notebook_renders_through_papermill(use_solutions, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), parameters={"solutions": use_solutions},
                               kernel_name="python3", cwd=str(tmp_path), progress_bar=False, execution_timeout=120)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in code_cells(nb) for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    answers = [c.outputs[-1]["data"]["text/plain"] for c in code_cells(nb) if c.source.startswith("check.")]
    assert len(answers) == len(EXERCISES)
    word = "PASSED" if use_solutions else "NOT YET"
    assert all(a.startswith(word) for a in answers), answers
    if not use_solutions:
        assert all("first difference" in a or "shape: yours" in a for a in answers), answers


# -- near-right answers: each check's tolerance and chosen cases reject an answer only slightly wrong ----------------


def _scaled(fn, factor):
    return lambda *a: fn(*a) * factor


def _in_float32(q, tiles, scale):
    """The solution computed in float32 from the float64 inputs: right to about 1e-7, not to fp64's precision."""
    return solutions.online_softmax(q.float(), ((k.float(), v.float()) for k, v in tiles), scale)


@pytest.mark.parametrize("answer", [_scaled(solutions.online_softmax, 1 + 1e-5), _in_float32,
                                    _scaled(solutions.online_softmax, 1 + 3e-9)],
                         ids=["off by 1e-5 relative", "computed in float32", "off by 3e-9 relative"])
def test_the_online_softmax_check_holds_an_fp64_answer_to_fp64_precision(answer):
    """The check's tolerance is rtol 1e-9: an answer three times that far off fails, and so does one in float32."""
    assert Checks().online_softmax(solutions.online_softmax).ok
    text = repr(Checks().online_softmax(answer))
    assert text.startswith("NOT YET") and "on random inputs" in text and "first difference at index [" in text, text


@frame.interpreted_jit
def _off_by_three_ten_thousandths(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D: tl.constexpr,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    acc, l_i = solutions.attend_block(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D, BLOCK_M, BLOCK_N, CAUSAL)
    return acc * 1.0003, l_i


def test_the_kernel_check_rejects_an_output_three_times_its_tolerance_off():
    """The check holds the fp32 kernel to rtol 1e-4 against the fp64 oracle: O off by 3e-4 relative fails."""
    text = repr(Checks().kernel(_off_by_three_ten_thousandths))
    assert text.startswith("NOT YET") and "non-causal" in text and "first difference at index [" in text, text


def test_the_bytes_check_rejects_an_answer_a_few_bytes_or_one_long_row_case_off():
    def forgets_q(build, B, H, N, D, dtype, causal):  # Q's read left out: 0.1-0.4 % fewer bytes moved
        moved, held = solutions.moved_and_held(build, B, H, N, D, dtype, causal)
        return moved - B * H * N * D * {"float32": 4}.get(dtype, 2), held

    def one_byte_over(*case):
        moved, held = solutions.moved_and_held(*case)
        return moved + 1, held

    def one_softmax_read(build, B, H, N, D, dtype, causal):  # S read once at every N, the long row too
        moved, held = solutions.moved_and_held(build, B, H, N, D, dtype, causal)
        if build == "materialised" and N > 16384:
            moved -= B * H * N * N * {"float32": 4}.get(dtype, 2)
        return moved, held

    text = repr(Checks().bytes(forgets_q))
    assert "first difference: materialised, B=1 H=16 N=4096" in text and "1 × one Q-sized tensor" in text, text
    text = repr(Checks().bytes(one_byte_over))
    assert "bytes moved: yours 2,181,038,081, expected 2,181,038,080" in text and "expected − yours = -1 B" in text
    text = repr(Checks().bytes(one_softmax_read))
    assert "first difference: materialised, B=1 H=4 N=32768 D=64 float16 non-causal, bytes moved" in text, text
    assert "expected − yours = 8,589,934,592 B = 1 × one N×N tensor" in text, text


def test_the_causal_check_rejects_an_extra_block_past_n_and_a_flop_count_one_tile_short():
    def unclamped(m, N, BLOCK_M, BLOCK_N):  # the block's last row taken as (m + 1)·BLOCK_M − 1, even past N
        return list(range(((m + 1) * BLOCK_M - 1) // BLOCK_N + 1))

    def one_tile_short(B, H, N, D, BLOCK_M, BLOCK_N):
        return solutions.causal_flops_saved(B, H, N, D, BLOCK_M, BLOCK_N) - B * H * 4 * BLOCK_M * BLOCK_N * D

    text = repr(Checks().causal(unclamped, solutions.causal_flops_saved))
    assert "key_blocks: N=100 BLOCK_M=32 BLOCK_N=16, query block 3 (rows 96–99): first difference at position 7: " \
           "yours has 7" in text, text
    text = repr(Checks().causal(solutions.key_blocks, one_tile_short))
    assert "yours 2,883,584, expected 3,145,728" in text, text


def test_the_ablation_check_rejects_an_output_three_times_its_tolerance_off():
    """O of the ablated program off by 3e-4 relative (three times the check's rtol): consumed, so not flagged dead,
    but not the ablated program's output."""
    verdict = Checks().ablation(_scaled(solutions.no_softmax, 1 + 3e-4))
    text = repr(verdict)
    assert not verdict.ok and "not the ablated program's O" in text and "raises no dead-work flag" in text, text


def test_the_lies_check_rejects_the_right_rows_with_their_lies_swapped():
    swapped = {4: "timer", 5: "mixed_ratio", 6: "allocation"}
    text = repr(Checks().lies(swapped))
    assert "first difference at row 4 (fused, causal): yours 'timer', expected 'mixed_ratio'" in text, text
