"""A transformers causal LM's training step with each build as its attention: loss and parameter gradients against
transformers' SDPA path, the step's peak allocation and its time.

    model = trainable(model_forward.build(spec, dtype=..., device=...))
    out = training_step(model, "fused", ids, labels)     {"loss": float, "grads": {parameter name: its gradient}}
    rows = measure(spec, ["fused", "materialised"], B=1, N=1024, dtype="bfloat16", device="cuda", seed=0)

One step is one forward with the causal LM loss (transformers' own: the mean cross-entropy of each next token, on
random token ids, labels = ids) and one backward, in train mode, every parameter requiring grad. Our builds reach the
model through attnlab.hf_attention, whose torch ops (attnlab.builds.ops) run a build's training forward, and the
backward registered with it, whenever grad is on and q, k or v requires it: inside a training step they always do.
The library rows run their own calls and torch's autograd gives their backward.

The rule for "matches SDPA's gradients". transformers' SDPA path (transformers_sdpa) is the reference; its eager path
(transformers_eager: the same attention in plain torch ops) is the yardstick, the difference two correct attentions
show in this model, dtype and input. For the loss and for every parameter tensor x, a build's relative difference

    diff(x) = ‖g_build(x) − g_sdpa(x)‖ / ‖g_sdpa(x)‖          (for the loss: |loss − loss_sdpa| / |loss_sdpa|)

must stay within

    limit(x) = max(2 · diff_eager(x), FLOOR[dtype])          (attnlab.accuracy.FLOOR: 1e-5 in float32, 2e-3 in
                                                              float16, 1.5e-2 in bfloat16)

the forward gate's rule (attnlab.accuracy: at most twice as far as plain torch), with SDPA in the oracle's place and
transformers' eager attention as plain torch. The limit is per tensor, so a wrong gradient in a small tensor is not
hidden by a large one. There is no cap: the accuracy gate's CAP bounds one attention against an fp64 oracle, while
here both sides carry a whole model's rounding. A row `matches` when the largest diff(x) / limit(x), `over_limit`,
is at most 1. Where transformers' eager row failed, limit(x) is FLOOR[dtype] alone.

Each build's failure (unsupported, out of memory, an error) is its row's status, never an exception, and never
loses another build's row. Inputs depend on (seed, B, N) only (attnlab.model_forward.token_ids), never on the build.
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from attnlab import accuracy, measure as harness, model_forward as mf, provenance
from attnlab.builds import training

REFERENCE = mf.REFERENCE  # transformers' SDPA path: every row's loss and gradients are compared with its
YARDSTICK = "transformers_eager"  # transformers' eager attention: its difference to SDPA sets each limit
BUILDS = (*mf.TRANSFORMERS, *training.names())  # what may be a model's attention in a training step
DTYPES = ("float32", "float16", "bfloat16")
LOSS = "loss"  # the name the loss goes by among the parameter tensors in a row's differences

COLUMNS = {
    "model": "the model config's name", "model_type": "transformers' model type", "layers": "decoder layers",
    "hidden": "hidden size", "H": "query heads", "Hkv": "key/value heads", "D": "head dim", "vocab": "vocabulary",
    "params": "parameters of the model", "B": "batch (sequences)", "N": "sequence length (tokens per sequence)",
    "dtype": "the model's dtype",
    "build": "the attention: transformers_sdpa, transformers_eager, or one of attnlab's builds with a backward",
    "family": "'transformers', 'ours' or 'library'",
    "impl": "the attention implementation's name in transformers",
    "saved": "what the attention holds from forward to backward, in words (attnlab.builds.training.saved)",
    "device": "e.g. 'cuda:0' or 'cpu'", "device_name": "e.g. 'NVIDIA H200' or the CPU model",
    "status": "'ok', 'unsupported: <why>', 'oom: ...' or 'error: <type>: <message>'",
    "loss": "the step's causal LM loss (mean cross-entropy per predicted token, nats)",
    "loss_diff": "|loss − transformers_sdpa's loss|",
    "grad_rel_max": "the largest ‖g − g_sdpa‖ / ‖g_sdpa‖ over the parameter tensors",
    "grad_rel_tensor": "the parameter tensor where grad_rel_max is",
    "over_limit": "the largest diff / limit over the loss and every parameter tensor (module docstring): <= 1 "
                  "matches",
    "over_limit_at": "the loss or the parameter tensor where over_limit is",
    "matches": "over_limit <= 1: the build gives SDPA's loss and gradients within the rule",
    "grad_bytes": "bytes of the parameters' gradients, which every step allocates (part of every peak)",
    "peak_bytes": "peak allocation of one step above what was allocated before it (the weights, and the reference "
                  "gradients the measurement keeps); NaN on a CPU",
    "peak_note": "why peak_bytes is NaN",
    "step_ms": "one step (zero_grad, forward with loss, backward), issued back to back after a warm-up step: CUDA "
               "events on a GPU; on a CPU time.perf_counter, which measures Python (Triton's interpreter)",
    "step_reps": "steps timed", "timer": "the timer (attnlab.measure.eager_ms's name for it)",
    "note": "what the comparison columns are not: the reference itself, the yardstick, no reference to compare with",
    "code": "fingerprint of the attnlab sources that measured the row (provenance.code_hash)",
}


def trainable(model):
    """`model` made ready for a training step: train mode, every parameter requiring grad. Returns it.
    (attnlab.model_forward.build makes an inference model, eval mode and no grad, which its forward measures.)"""
    model.train()
    model.requires_grad_(True)
    return model


def saved(build_name: str) -> str:
    """What the build's attention holds from forward to backward, in words."""
    if build_name == YARDSTICK:
        return training.saved("torch_eager")
    return training.saved("sdpa_default" if build_name == REFERENCE else build_name)


def check_build(build_name) -> None:
    if build_name not in BUILDS:
        raise ValueError(f"build must be one of {', '.join(BUILDS)} (a build with a backward, or transformers' own "
                         f"attention); got {build_name!r}")


def check_tokens(ids, labels) -> None:
    """ids and labels: integer tensors (B, N) of one shape, N >= 2 (the loss predicts each next token)."""
    for name, t in (("ids", ids), ("labels", labels)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.long:
            raise ValueError(f"{name} must be a (B, N) tensor of token ids (torch.long); got "
                             f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
    if labels.shape != ids.shape:
        raise ValueError(f"labels must have ids' shape {tuple(ids.shape)}; got {tuple(labels.shape)}")
    if ids.shape[1] < 2:
        raise ValueError(f"N (tokens per sequence) must be >= 2: the loss predicts each next token; got "
                         f"{ids.shape[1]}")


def step(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One training step with the attention the model has now: gradients dropped (set to None, so the step allocates
    them), the forward with transformers' causal LM loss, the backward. Returns the loss, detached."""
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    return loss.detach()


def training_step(model, build_name: str, ids: torch.Tensor, labels: torch.Tensor) -> dict:
    """One forward with loss and one backward of `model` (made trainable) with `build_name` as its attention:
    {"loss": the loss (float), "grads": {parameter name: its gradient}}. ValueError for a build without a backward
    or token ids that give no loss (check_tokens), before any work."""
    check_build(build_name)
    check_tokens(ids, labels)
    trainable(model)
    mf.use(model, build_name)
    loss = step(model, ids, labels)
    return {"loss": float(loss), "grads": {n: p.grad for n, p in model.named_parameters()}}


def differences(out: dict, ref: dict) -> dict[str, float]:
    """{LOSS: |Δloss| / |loss_ref|, parameter name: ‖g − g_ref‖ / ‖g_ref‖} of one step's output against the
    reference's (attnlab.accuracy.rel_error, float64: inf for a gradient holding NaN or inf, or missing)."""
    d = {LOSS: abs(out["loss"] - ref["loss"]) / abs(ref["loss"])}
    for name, g_ref in ref["grads"].items():
        g = out["grads"].get(name)
        d[name] = math.inf if g is None else accuracy.rel_error(g, g_ref.to(torch.float64))
    return d


def limit(x: str, yardstick: dict[str, float], dtype: torch.dtype) -> float:
    """max(2 · the yardstick's difference at x, FLOOR[dtype]); FLOOR alone where the yardstick has no finite
    difference at x."""
    yard = yardstick.get(x, 0.0)
    return max(2 * yard if math.isfinite(yard) else 0.0, accuracy.FLOOR[dtype])


def judge(diffs: dict[str, float], yardstick: dict[str, float], dtype: torch.dtype) -> dict:
    """The rule (module docstring) over one row's differences: {"over_limit": the largest diff / limit,
    "over_limit_at": where, "matches": over_limit <= 1}. `yardstick` holds transformers' eager path's differences
    (empty where it has none). A NaN difference counts as infinitely far."""
    ratios = {x: (math.inf if math.isnan(d) else d) / limit(x, yardstick, dtype) for x, d in diffs.items()}
    at = max(ratios, key=ratios.get)
    return {"over_limit": ratios[at], "over_limit_at": at, "matches": ratios[at] <= 1}


def base_row(model, spec: mf.ModelSpec, build_name: str, B: int, N: int) -> dict:
    p = next(model.parameters())
    row = {c: math.nan for c in COLUMNS}
    row.update(model=spec.name, model_type=spec.model_type, layers=spec.layers, hidden=spec.hidden, H=spec.heads,
               Hkv=spec.kv_heads, D=spec.head_dim, vocab=spec.vocab, params=sum(t.numel() for t in model.parameters()),
               B=B, N=N, dtype=str(p.dtype).removeprefix("torch."), build=build_name,
               family=mf.family_of(build_name), impl=mf.impl_of(build_name), saved=saved(build_name),
               device=str(p.device), device_name=provenance.device_name(str(p.device)), status="",
               grad_rel_tensor="", over_limit_at="", matches=False, peak_note="", timer="", note="",
               grad_bytes=sum(t.numel() * t.element_size() for t in model.parameters()), code=provenance.code_hash())
    return row


def check(spec, builds, B, N, dtype, device) -> list[str]:
    """The measurement's arguments, checked before any work; returns the builds to run in order: transformers_sdpa
    (the reference), transformers_eager (the yardstick), then the others as given."""
    if not isinstance(spec, mf.ModelSpec):
        raise ValueError(f"spec must be an attnlab.model_forward.ModelSpec; got {type(spec).__name__}")
    if isinstance(builds, str) or not list(builds):
        raise ValueError(f"builds must be a non-empty list of build names; got {builds!r}")
    for b in builds:
        check_build(b)
    for name, value, least in (("B", B, 1), ("N", N, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            why = " (the loss predicts each next token)" if name == "N" else ""
            raise ValueError(f"{name} must be a whole number >= {least}{why}; got {value!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda'; got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device is {device!r}, and torch sees no CUDA device here")
    return list(dict.fromkeys([REFERENCE, YARDSTICK, *builds]))


def measure(spec: mf.ModelSpec, builds, B: int, N: int, dtype: str = "float32", device: str = "cpu",
            seed: int = 0, *, reps_ms: float = 100.0, min_reps: int = 3) -> pd.DataFrame:
    """One row of COLUMNS per build: the model of `spec` (random weights from `seed`) trained one step on random
    token ids (B, N) with each build as its attention, transformers_sdpa and transformers_eager first (the
    reference and the yardstick of the rule in the module docstring). Per build: the step whose loss and gradients
    are compared, a step whose peak allocation is read (attnlab.measure.peak_pass), then steps timed back to back
    (attnlab.measure.eager_ms: a warm-up step, then at least `min_reps` steps filling `reps_ms`)."""
    order = check(spec, builds, B, N, dtype, device)
    model = trainable(mf.build(spec, dtype=dtype, device=device, seed=seed))
    dev = next(model.parameters()).device
    ids = mf.token_ids(spec, B, N, seed, dev)
    ref, yardstick, rows = None, {}, []
    for name in order:
        row = base_row(model, spec, name, B, N)
        try:
            out = training_step(model, name, ids, ids)
            row["loss"] = out["loss"]
            if name == REFERENCE:
                ref = out
            if ref is None:
                row["note"] = f"{REFERENCE} did not run: no reference to compare with"
            else:
                diffs = differences(out, ref)
                if name == YARDSTICK:
                    yardstick = diffs
                grads = {x: d for x, d in diffs.items() if x != LOSS}
                row["grad_rel_tensor"] = max(grads, key=grads.get)
                row.update(loss_diff=abs(out["loss"] - ref["loss"]), grad_rel_max=grads[row["grad_rel_tensor"]],
                           **judge(diffs, yardstick, model.dtype))
                row["note"] = {REFERENCE: "the reference: every row's loss and gradients are compared with this "
                                          "build's",
                               YARDSTICK: "the yardstick: its differences to the reference set each limit"
                               }.get(name, "" if yardstick else f"{YARDSTICK} did not run: every limit is the "
                                                                 f"dtype's floor")
            del out
            model.zero_grad(set_to_none=True)  # the peak pass's step allocates the gradients it is charged with

            def call():
                return step(model, ids, ids)

            # a CPU has no allocator statistics: there peak_pass is given nothing to run, not one more step
            row["peak_bytes"], row["peak_note"], _ = harness.peak_pass(call if dev.type == "cuda" else tuple, dev)
            row["step_ms"], row["step_reps"], row["timer"] = harness.eager_ms(call, dev, reps_ms=reps_ms,
                                                                              min_reps=min_reps)
            if dev.type != "cuda":
                row["timer"] += " (Python's time: Triton's interpreter, not kernels)"
            row["status"] = "ok"
        except Exception as e:  # a build that cannot step is its row's status; the others still run
            row["status"] = mf.failure(e)
        model.zero_grad(set_to_none=True)
        if row["status"] != "ok":
            harness.release(dev)
        rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))
