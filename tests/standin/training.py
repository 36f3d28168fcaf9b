"""A stand-in for the GPU under notebooks/training.ipynb: attnlab.measure.measure writes, for each case of the training
sweep, a row as a CUDA device would (device cuda:0, DEVICE_NAME) whose time, held bytes and status are chosen here;
the ceilings are CEILINGS, and the run's provenance names DEVICE_NAME with TOTAL_MEMORY. Everything else (the
params, the sweep's loop and files, the byte model, the report, the page) is the real code. The shapes cost nothing
here, so they are the bench's: bf16, B·N = 16384, H·D = 2048, D = 64, N = 1024, 2048 and 4096, causal and not.

Times: fused's forward+backward takes FUSED_MS at N = 1024, growing as N (B·H·N is fixed), half when causal;
materialised's is MATERIALISED[N] times fused's, each other build's FACTOR[build] times; a backward alone is
BACKWARD_SHARE of its forward+backward, a forward the rest. materialised and torch_eager run out of memory at N = 4096
in both backward passes (OOM_FROM), asking for OOM_BYTES. Held bytes are HELD_OVER_SAVED[build] times what
attnlab.cost says the build must save; the peak twice that. So fused's forward+backward is 3.1× and 3.6×
materialised's speed at N = 1024 and 2048, 0.95× cuDNN's and 1.42× FlashAttention-2's at every shape, and torch_eager
holds 1.5× its P.

The real model's training step (attnlab.model_train.measure) gives a row per build, transformers' SDPA and eager
paths first, each ok on cuda:0 with STEP[build] = (over_limit, peak GiB above the weights, ms per step): every build
matches SDPA's gradients, and fused's step peaks 0.6 GiB below materialised's.
"""
from __future__ import annotations

DEVICE_NAME = "STAND-IN GPU 3T"
TOTAL_MEMORY = 80 * (1 << 30)
CEILINGS = {"tbps": 3.35, "tflops": 745.0, "timer": "stand-in", "matmul_n": 8192}
FUSED_MS = 1.25
FACTOR = {"fused": 1.0, "qk_softmax": 1.9, "sdpa_cudnn": 0.95, "sdpa_flash": 1.42, "torch_eager": 3.1 * 1.2}
MATERIALISED = {1024: 3.1, 2048: 3.6, 4096: 4.0}  # materialised's forward+backward over fused's, by N
BACKWARD_SHARE = 0.7
OOM_FROM = {"materialised": 4096, "torch_eager": 4096}
OOM_BYTES = 51_539_607_552
STEP = {"transformers_sdpa": (0.0, 1.0, 10.0), "transformers_eager": (0.5, 1.5, 14.0), "materialised": (0.6, 1.6, 15.0),
        "qk_softmax": (0.7, 1.3, 12.0), "fused": (0.8, 1.0, 10.5), "torch_eager": (0.5, 1.5, 14.0)}
HELD_OVER_SAVED = {"materialised": 1.0, "qk_softmax": 1.0, "fused": 1.0, "sdpa_cudnn": 1.0, "sdpa_flash": 1.0,
                   "torch_eager": 1.5}


def ms(build: str, N: int, causal: bool, pass_: str) -> float:
    fused = FUSED_MS * N / 1024 * (0.5 if causal else 1.0)
    both = fused * (MATERIALISED[N] if build == "materialised" else FACTOR[build])
    return both * {"forward+backward": 1.0, "backward": BACKWARD_SHARE, "forward": 1 - BACKWARD_SHARE}[pass_]


def step_rows(spec, builds, B, N, dtype="float32", device="cpu", seed=0, **_):
    """model_train.measure's rows as a GPU would give them, from STEP."""
    import pandas as pd

    from attnlab import model_train

    rows = []
    for build in dict.fromkeys([model_train.REFERENCE, model_train.YARDSTICK, *builds]):
        over, peak, ms_ = STEP[build]
        row = {c: float("nan") for c in model_train.COLUMNS}
        row.update(model=spec.name, model_type=spec.model_type, layers=spec.layers, hidden=spec.hidden, H=spec.heads,
                   Hkv=spec.kv_heads, D=spec.head_dim, vocab=spec.vocab, params=1_000_000, B=B, N=N, dtype=dtype,
                   build=build, family="", impl="", saved="", device="cuda:0", device_name=DEVICE_NAME, status="ok",
                   loss=5.5, loss_diff=over * 1e-4, grad_rel_max=over * 1e-3, grad_rel_tensor="lm_head.weight",
                   over_limit=over, over_limit_at="lm_head.weight", matches=over <= 1, grad_bytes=1 << 24,
                   peak_bytes=peak * (1 << 30), peak_note="", step_ms=ms_, step_reps=10, timer="cuda events",
                   note="", code="")
        rows.append(row)
    return pd.DataFrame(rows)


def install() -> None:
    from attnlab import ceilings, cost, measure, model_train, provenance, sweep

    collect = provenance.collect

    def stand_in_collect(device):
        found = collect(device)
        found["device"] = {**found["device"], "device": "cuda:0", "name": DEVICE_NAME, "total_memory": TOTAL_MEMORY}
        return found

    def stand_in_ceilings(device, dtype):
        return {**CEILINGS, "dtype": dtype}

    def stand_in_measure(case, *, ceilings, run_id="", **_):
        row = measure.base_row(case, ceilings=ceilings, run_id=run_id)
        row.update(device="cuda:0", device_name=DEVICE_NAME)
        if case.pass_ != "forward" and case.N >= OOM_FROM.get(case.build, 1 << 30):
            row["status"] = f"oom: {OOM_BYTES} bytes wanted (the failed allocation)"
            return row
        t = ms(case.build, case.N, case.causal, case.pass_)
        held = HELD_OVER_SAVED[case.build] * cost.saved_bytes(case) if case.pass_ != "forward" else float("nan")
        row.update(status="ok", cold_s=0.5, ms=t, ms_p20=t * 0.99, ms_p80=t * 1.01, reps=50, timer="do_bench+graph",
                   host_ms=0.01, eager_ms=t + 0.01, timing_note="", held_bytes=held,
                   peak_bytes=2 * held if held == held else float(row["hold_bytes"]), peak_note="", alloc_flag="",
                   err=1e-3, err_limit=1e-2, err_note="", checksum=1.0, consume_ms=0.0, compile_note="")
        return measure.rates(row)

    provenance.collect = stand_in_collect
    ceilings.measure_ceilings = stand_in_ceilings
    sweep.measure_ceilings = stand_in_ceilings
    measure.measure = stand_in_measure
    model_train.measure = step_rows
