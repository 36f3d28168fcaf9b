"""The gradient gate: dQ, dK and dV of every build with a backward against the fp64 autograd oracle, on fresh random
inputs at every shape of the correctness gate's grid (attnlab.gate).

    attnlab check --grad                  every build with a backward (attnlab.builds.training.names) that suits the
                                          device, at every shape of the gate's grid
    attnlab check --grad --out g.csv      also write one row per (build, shape, gradient)
    attnlab check --grad --quick --builds materialised,qk_softmax --jobs 4 ...   the gate's options, as there

The oracle is torch.autograd through attnlab.reference.attend in float64 (reference.grads) for a random dO; the
rule is the forward's (attnlab.accuracy): each gradient at most twice as far from the oracle as plain torch autograd
in the inputs' dtype. Our builds run their training forward, then their backward into NaN-poisoned dq, dk and dv
(`out=`), so an element a kernel never writes fails; the library rows run through torch's autograd. A build that
fails or raises on one shape leaves every other row standing. Exit status 1 when any gradient fails; unsupported
cases are listed, not failed.
"""
from __future__ import annotations

import sys

import torch

from attnlab import gate

DO_SEED = 1  # dO of the shape drawn with seed + DO_SEED: independent of q, k and v


def default_builds(device: torch.device) -> list[str]:
    """The builds with a backward that the gate checks on this device: compiled FlexAttention only on a GPU (its
    compile costs the CPU minutes), as the forward gate does."""
    from attnlab.builds import training

    return [n for n in training.names() if n in gate.default_builds(device)]


def _build(name: str) -> str:
    from attnlab.builds import training

    training.attend(name)  # ValueError for an ablation or an unknown name
    return name


def gradients(name: str, do, q, k, v, causal: bool) -> tuple:
    """(dq, dk, dv) of one build for dO: ours by their training forward and backward, the backward writing into
    NaN-filled tensors; the library's by torch.autograd through their call."""
    from attnlab import builds
    from attnlab.builds import training

    if builds.get(name).family == "ours":
        o, kept = training.forward_of(name)(q, k, v, causal=causal)
        out = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        return training.backward_of(name)(do, q, k, v, o, kept, causal=causal, out=out)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        return torch.autograd.grad(training.attend(name)(*leaves, causal=causal), leaves, do)


def check_case(case, names: list[str], device, seed: int) -> list[dict]:
    """Every named build's gradients on one fresh input set (the harness's: random normal, never zeros) and one
    random dO; one row a gradient."""
    from attnlab import accuracy, builds
    from attnlab.measure import make_inputs, one_line

    q, k, v = make_inputs(case, seed)
    do = make_inputs(case, seed + DO_SEED)[0]
    rows = []
    shapes = {name: dict(build=name, shape=seed - gate.SEED0, B=case.B, H=case.H, Hkv=case.Hkv, N=case.N, D=case.D,
                         dtype=case.dtype, causal=case.causal) for name in names}
    try:
        refs = accuracy.grad_refs(do, q, k, v, causal=case.causal)
    except torch.OutOfMemoryError:  # this shape goes unjudged, and says so; the process goes on to its next shapes
        return [dict(shape, grad=g_name, status="oom: the fp64 oracle") for shape in shapes.values()
                for g_name in accuracy.GRADS]
    for name, shape in shapes.items():
        try:
            grads = gradients(name, do, q, k, v, case.causal)
            for g_name, grad, verdict in zip(accuracy.GRADS, grads, accuracy.judge_grads(grads, refs).values()):
                unwritten = int(torch.isnan(grad).sum())
                rows.append(dict(shape, grad=g_name, status="ok" if verdict.ok and unwritten == 0 else "FAIL",
                                 err=verdict.err, limit=verdict.limit, err_lowp=verdict.err_lowp,
                                 unwritten=unwritten))
            continue
        except builds.Unsupported as e:
            status = f"unsupported: {e}"
        except torch.OutOfMemoryError:
            status = "oom"
        except Exception as e:  # noqa: BLE001 - one broken build must not hide the others' results
            status = one_line(f"FAIL: {type(e).__name__}: {e}", 600)
        rows += [dict(shape, grad=g_name, status=status) for g_name in accuracy.GRADS]
    return rows


GRADIENTS = gate.Checker(check_case, default_builds, _build, "attnlab.grad_gate", "attnlab check --grad", __doc__,
                         "gradient gate", "grad gate")


def main(argv: list[str] | None = None) -> int:
    """`attnlab check --grad`: the gate's command line (attnlab.gate.main) with the gradients' checks."""
    return gate.main(argv, GRADIENTS)


if __name__ == "__main__":
    sys.exit(main())
