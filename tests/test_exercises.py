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
from attnlab.exercises.verdict import tensor_difference

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


# What each skeleton's answer must say: the first place it goes wrong, with the student's value, and a hint at why.
WHERE_AND_HINT = {
    "bytes": ["first difference: materialised, B=1 H=16 N=4096 D=64 bfloat16 non-causal, bytes moved: yours 33,554,432",
              "hint: yours counts too few bytes moved, by whole N×N tensors (S or P)",
              "materialised writes S and P, and reads each back"],
    "online_softmax": ["on random inputs", "first difference at index [", "yours ",
                       "hint: your running sum and accumulator are not rescaled when the max changes"],
    "kernel": ["non-causal", "first difference at index [0, 0, 0, 0]: yours ",
               "hint: the last key tile runs past N: its keys past N were loaded as zeros"],
    "causal": ["query block 0 (rows 0–15): yours [0, 1, 2, 3]",
               "hint: yours visits key block 1 (keys 16–31), whose every key comes after every row of this block"],
    "ablation": ["shape: yours (), expected (1, 8, 512, 64)", "ablation_table flags it",
                 "check that its output is consumed", "hint: an ablation removes one stage, not the whole program"],
    "lies": ["row 2 (fused, non-causal): yours says 'allocation', but the lab's allocation guard finds nothing wrong",
             "hint: compare its peak with what its build must hold"],
}


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_skeleton_fails_its_check_with_where_and_a_hint(exercise, skeletons):
    method, names = EXERCISES[exercise]
    verdict = getattr(Checks(), method)(*(skeletons[n] for n in names))
    assert not verdict.ok
    text = repr(verdict)
    assert text.startswith("NOT YET")
    for part in WHERE_AND_HINT[exercise]:
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
    assert "hint: yours is not finite (inf or NaN) where the largest scores, near 1000, come in the last tile" in text
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
    assert "hint: the causal mask is not applied" in text, text
    text = repr(Checks().kernel(solutions.online_softmax))  # a plain function: no kernel piece at all
    assert "not a function Triton's interpreter runs" in text


def test_the_causal_check_counts_the_oracles_live_tiles():
    assert checks.live_blocks(100, 32, 16) == {0: [0, 1], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3, 4, 5],
                                               3: list(range(7))}  # rows 96–99 reach key block 6 (96–111)
    text = repr(Checks().causal(solutions.key_blocks, lambda *a: 0))
    assert "causal_flops_saved(B=2, H=4, N=128, D=16, BLOCK_M=32, BLOCK_N=16): yours 0" in text, text
    assert "hint: yours is 0 skipped tiles a head" in text and "3,145,728" not in text, text
    text = repr(Checks().causal(solutions.key_blocks, lambda B, H, N, D, BM, BN: 2 * B * H * N * N * D))
    assert "hint: yours is the model's ideal half of the FLOPs" in text, text


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
    assert "yours names 2 of the table's 3 lying rows; a row yours leaves out tells a mixed_ratio lie" in missing
    assert "row 4" not in missing and "hint: read its baseline_row" in missing


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


def test_differences_name_the_first_index_your_value_and_how_far_off_never_the_expected_value():
    expected = torch.full((3, 4), 0.25, dtype=torch.float64)
    yours = expected.clone()
    yours[1, 2], yours[0, 3] = 0.5, 0.25 + 3e-6
    text = tensor_difference(yours, expected, rtol=1e-6, atol=1e-9)
    assert text.startswith("first difference at index [0, 3]: yours 0.250003; 2 of 12 elements differ"), text
    assert "the farthest at [1, 2]: yours 0.5, about 1e+06 × the tolerance" in text and "0.25 " not in text, text
    yours[2, 0] = math.nan
    assert "the farthest at [2, 0]: yours nan, not finite" in tensor_difference(yours, expected, rtol=1e-6, atol=1e-9)
    assert tensor_difference(expected, expected, rtol=0, atol=0) is None
    assert tensor_difference(yours[:2], expected, rtol=0, atol=0) == "shape: yours (2, 4), expected (3, 4)"


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
        assert all("\n  hint: " in a for a in answers), answers


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
    assert "first difference: materialised, B=1 H=16 N=4096" in text, text
    assert "too few bytes moved, by whole Q-sized tensors: count the reads of Q, K and V" in text, text
    text = repr(Checks().bytes(one_byte_over))
    assert "bytes moved: yours 2,181,038,081\n" in text and "2,181,038,080" not in text, text
    assert "too many bytes moved, by a part of an element: each element of this dtype is 2 B" in text, text
    text = repr(Checks().bytes(one_softmax_read))
    assert "first difference: materialised, B=1 H=4 N=32768 D=64 float16 non-causal, bytes moved" in text, text
    assert "too few bytes moved, by whole N×N tensors" in text and "first with N past 16384" in text, text


def test_the_causal_check_rejects_an_extra_block_past_n_and_a_flop_count_one_tile_short():
    def unclamped(m, N, BLOCK_M, BLOCK_N):  # the block's last row taken as (m + 1)·BLOCK_M − 1, even past N
        return list(range(((m + 1) * BLOCK_M - 1) // BLOCK_N + 1))

    def one_tile_short(B, H, N, D, BLOCK_M, BLOCK_N):
        return solutions.causal_flops_saved(B, H, N, D, BLOCK_M, BLOCK_N) - B * H * 4 * BLOCK_M * BLOCK_N * D

    text = repr(Checks().causal(unclamped, solutions.causal_flops_saved))
    assert "key_blocks: N=100 BLOCK_M=32 BLOCK_N=16, query block 3 (rows 96–99): yours [0, 1, 2, 3, 4, 5, 6, 7]" \
           in text, text
    assert "hint: yours visits key block 7 (keys 112–127), which is not in 0–6: N = 100 keys make 7 blocks" in text
    text = repr(Checks().causal(solutions.key_blocks, one_tile_short))
    assert "yours 2,883,584" in text and "hint: yours is 11 skipped tiles a head" in text, text
    assert "3,145,728" not in text, text


def test_the_ablation_check_rejects_an_output_three_times_its_tolerance_off():
    """O of the ablated program off by 3e-4 relative (three times the check's rtol): consumed, so not flagged dead,
    but not the ablated program's output."""
    verdict = Checks().ablation(_scaled(solutions.no_softmax, 1 + 3e-4))
    text = repr(verdict)
    assert not verdict.ok and "not the ablated program's O" in text and "raises no dead-work flag" in text, text


def test_the_lies_check_rejects_the_right_rows_with_their_lies_swapped():
    swapped = {4: "timer", 5: "mixed_ratio", 6: "allocation"}
    text = repr(Checks().lies(swapped))
    assert "row 4 (fused, causal): yours says 'timer', but the lab's timer guard finds nothing wrong there" in text
    assert "mixed_ratio" not in text, text


# -- the online softmax must stream: right numbers computed another way are refused, each rule with its reason -------


def _two_passes(q, tiles, scale):  # the max over every tile first, then the sum: two passes over K
    m = None
    for k, _ in tiles:
        tile_max = (q @ k.T * scale).amax(dim=1)
        m = tile_max if m is None else torch.maximum(m, tile_max)
    l = acc = 0
    for k, v in tiles:
        p = torch.exp(q @ k.T * scale - m[:, None])
        l, acc = l + p.sum(dim=1), acc + p @ v
    return acc / l[:, None]


def _tiles_in_a_list(q, tiles, scale):  # every tile collected, then the softmax of the whole row
    tiles = list(tiles)
    k, v = torch.cat([k for k, _ in tiles]), torch.cat([v for _, v in tiles])
    return torch.softmax(q @ k.T * scale, dim=-1) @ v


def _views_kept(q, tiles, scale):  # no tile kept by name, but a view of each (k.T) keeps it
    kts, vs = [], []
    for k, v in tiles:
        kts.append(k.T)
        vs.append(v[:])
    return torch.softmax(torch.cat([q @ kt for kt in kts], dim=1) * scale, dim=-1) @ torch.cat(vs)


def _k_and_v_concatenated(q, tiles, scale):  # each tile let go, but copied into a growing K and V
    K = V = None
    for k, v in tiles:
        K, V = (k, v) if K is None else (torch.cat([K, k]), torch.cat([V, v]))
    return torch.softmax(q @ K.T * scale, dim=-1) @ V


def _every_tiles_scores_kept(q, tiles, scale):  # one pass, but the whole row of scores kept in pieces
    scores, values = [], []
    for k, v in tiles:
        scores.append(q @ k.T * scale)
        values.append(v.clone())
    m = torch.stack([s.amax(dim=1) for s in scores]).amax(dim=0)
    p = [torch.exp(s - m[:, None]) for s in scores]
    return sum(x @ v for x, v in zip(p, values)) / sum(x.sum(dim=1) for x in p)[:, None]


def _through_numpy(q, tiles, scale):  # the tiles taken out of torch, where the check cannot follow them
    import numpy as np

    ks, vs = zip(*((k.numpy(), v.numpy()) for k, v in tiles))
    k, v = torch.from_numpy(np.concatenate(ks)), torch.from_numpy(np.concatenate(vs))
    return torch.softmax(q @ k.T * scale, dim=-1) @ v


def _rule_caught(q, tiles, scale):  # breaks a rule, swallows the check's exception, returns the right numbers
    try:
        return _tiles_in_a_list(q, tiles, scale)
    except Exception:  # noqa: BLE001
        return torch.softmax(q @ torch.zeros(0, q.shape[1], dtype=q.dtype).T, dim=-1)


NOT_STREAMING = {  # answer → the rule it breaks
    _two_passes: "once", _tiles_in_a_list: "one tile", _views_kept: "one tile", _k_and_v_concatenated: "no row",
    _every_tiles_scores_kept: "no row", _through_numpy: "in torch", _rule_caught: "one tile",
}


def _oracle_rows(kind="random"):
    q, k, v = checks.softmax_inputs(kind)
    (r0, r1), scale = checks.SOFTMAX_SHAPE["rows"], checks.SOFTMAX_SHAPE["D"] ** -0.5
    rows = q[r0:r1].double()
    expected = torch.softmax(rows @ k.double().T * scale, dim=-1) @ v.double()
    return rows, k.double(), v.double(), scale, expected


@pytest.mark.parametrize("answer", [a for a in NOT_STREAMING if a is not _rule_caught],
                         ids=lambda a: a.__name__.strip("_"))
def test_a_non_streaming_answer_computes_the_right_numbers(answer):
    """What the rules refuse is not a wrong answer: outside the check, each gives the oracle's O."""
    rows, k, v, scale, expected = _oracle_rows()
    got = answer(rows, list(checks.key_tiles(k, v, checks.SOFTMAX_SHAPE["block_n"])), scale)
    assert torch.allclose(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("answer", NOT_STREAMING, ids=lambda a: a.__name__.strip("_"))
def test_a_non_streaming_answer_is_refused_with_the_rule_it_breaks(answer):
    text = repr(Checks().online_softmax(answer))
    rule = NOT_STREAMING[answer]
    assert text.startswith("NOT YET") and f"not streamed (rule '{rule}', attnlab.exercises.stream): " in text, text
    reason = {"once": "asked for the tiles a second time", "one tile": "still held tile 0",
              "no row": "more than a quarter of this block's whole score row", "in torch": "Tensor.numpy"}[rule]
    assert reason in text, text


def test_a_function_that_reads_some_tiles_is_told_every_key_counts():
    def first_tile_only(q, tiles, scale):
        k, v = next(iter(tiles))
        return torch.softmax(q @ k.T * scale, dim=-1) @ v

    text = repr(Checks().online_softmax(first_tile_only))
    assert "not streamed (rule 'every tile'" in text and "read 1 of the 63 key tiles" in text, text


def test_a_streaming_answer_that_asks_for_each_tile_one_step_ahead_passes():
    """The rules leave room for a double-buffered loop: asking for tile i while tiles i − 1 and i − 2 are still held
    (the one being used, and the consumer's loop variables) is streaming."""

    def lookahead(q, tiles, scale):
        it = iter(tiles)

        def ahead():
            nxt = next(it, None)
            while nxt is not None:
                cur, nxt = nxt, next(it, None)
                yield cur

        return solutions.online_softmax(q, ahead(), scale)

    verdict = Checks().online_softmax(lookahead)
    assert verdict.ok and "streamed: each key tile read once, one at a time" in repr(verdict), repr(verdict)


# -- a failing check gives a hint, never the value it expected -------------------------------------------------------


def _expected_texts(exercise: str, text: str, args: tuple) -> set[str]:
    """The expected values of the case each of FAILING's answers fails at, as a check would print them (verdict.fmt),
    which its verdict may not show: the first case's bytes, O's elements, the first query block's key blocks, the
    FLOPs saved, the lies of the rows the answers miss or mistake."""
    from types import SimpleNamespace

    from attnlab import cost, reference
    from attnlab.exercises.verdict import fmt

    if exercise == "bytes":
        b, B, H, N, D, t, c = checks.BYTES_CASES[0]
        case = SimpleNamespace(build=b, B=B, H=H, Hkv=H, N=N, D=D, dtype=t, causal=c)
        return {fmt(cost.bytes_moved(case)), fmt(cost.hold_bytes(case))}
    if exercise == "online_softmax":
        return {fmt(x) for kind in ("random", "last_tile") for x in _oracle_rows(kind)[-1].flatten().tolist()}
    if exercise == "kernel":
        s = checks.KERNEL_SHAPE
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(s["B"], s["H"], s["N"], s["D"], generator=g) for _ in range(3))
        causal = "\n  causal," in text  # the case the answer fails at
        return {fmt(x) for x in reference.attend(q, k, v, causal=causal).flatten().tolist()}
    if exercise == "causal":
        N, bm, bn = checks.CAUSAL_TILINGS[0]
        return {str(checks.live_blocks(N, bm, bn)[0]), "3,145,728"}
    if exercise == "ablation":
        return set()  # a wrong shape: no element to compare (its message is checked for the shape it expects)
    answer, lying = args[0], planted.found()
    return ({"None"} | {f"row {r}" for r in lying if r not in answer}  # an honest row's verdict; the lies missed
            | {repr(lie) for r, (lie, _) in lying.items()  # a mistaken row's lie, where the answer does not name it
               if answer.get(r, lie) != lie and lie not in answer.values()})


FAILING = {  # exercise → answers far off (the skeleton's names, or answers) and answers only slightly off
    "bytes": (["moved_and_held"], [lambda *case: tuple(x + 1 for x in solutions.moved_and_held(*case))]),
    "online_softmax": (["online_softmax"], [_scaled(solutions.online_softmax, 1 + 3e-9), _in_float32]),
    "kernel": (["attend_block", _ignores_causal], [_off_by_three_ten_thousandths]),
    "causal": ([("key_blocks", "causal_flops_saved"), (solutions.key_blocks, lambda *a: 0)], []),
    "ablation": (["no_softmax"], []),
    "lies": (["lying_rows", {5: "timer", 6: "allocation"}, {4: "timer", 5: "mixed_ratio", 6: "allocation"}], []),
}


def _failing_verdicts(exercise, skeletons, which=(0, 1)):
    method, _ = EXERCISES[exercise]
    for answer in (a for i in which for a in FAILING[exercise][i]):
        if isinstance(answer, str):
            args = (skeletons[answer],)
        elif isinstance(answer, tuple):
            args = tuple(skeletons[a] if isinstance(a, str) else a for a in answer)
        else:
            args = (answer,)
        yield args, getattr(Checks(), method)(*args)


@pytest.mark.parametrize("exercise", EXERCISES)
def test_a_failing_check_gives_a_hint_and_never_the_value_it_expected(exercise, skeletons):
    """Every failing answer gets a hint and no 'expected <value>'; an answer far off shows none of the expected
    values anywhere (one only slightly off shows its own value, which agrees with the expected one to the digits
    printed)."""
    import re

    for which in (0, 1):
        for args, verdict in _failing_verdicts(exercise, skeletons, (which,)):
            text = repr(verdict)
            assert not verdict.ok and "\n  hint: " in text, text
            assert not re.search(r"expected [-\d'\"\[]|expected None", text), text  # shapes and kinds only
            shown = [e for e in _expected_texts(exercise, text, args) if e in text] if which == 0 else []
            assert not shown, (shown, text)


@pytest.fixture
def solutions_unimportable(monkeypatch):
    """attnlab.exercises.solutions out of sys.modules and of its package, and an import hook that refuses it: the
    list it yields holds every attempt to import it."""
    import importlib.abc
    import sys

    import attnlab.exercises as package

    tried = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "attnlab.exercises.solutions":
                tried.append(name)
                raise ImportError("refused by the test: a check's error path must not import the solutions")
            return None

    monkeypatch.delitem(sys.modules, "attnlab.exercises.solutions", raising=False)
    monkeypatch.delattr(package, "solutions", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    return tried


def test_no_checks_error_path_imports_the_solutions(skeletons, solutions_unimportable):
    verdicts = [v for exercise in EXERCISES for _, v in _failing_verdicts(exercise, skeletons)]
    verdicts += [Checks().online_softmax(answer) for answer in NOT_STREAMING]
    verdicts += [Checks().bytes(lambda *a: 1 / 0), Checks().online_softmax(lambda *a: 1 / 0),
                 Checks().kernel(lambda *a: 0), Checks().lies([4])]
    assert not any(v.ok for v in verdicts)
    assert solutions_unimportable == []
    with pytest.raises(ImportError, match="refused by the test"):  # the hook works: solutions=True does import them
        Checks(solutions=True).bytes(None)
    assert solutions_unimportable == ["attnlab.exercises.solutions"]
