"""The results table: long format, one row per measured case, every column always present.

The sweep (attnlab.sweep) appends rows as they are measured; the reports (attnlab.report) are pure functions of a
table of such rows. Missing numbers are NaN with the reason in a *_note column, never 0. Two readings of a row live
here beside the columns they read: its recorded tiles (`tiles`), and its time less the consumption step (`ms`,
`consume_ms`).
"""
import json
import math

COLUMNS = {
    # identity of the case
    "run_id": "the run (output directory name) the row belongs to",
    "case_id": "stable key of the case within a run: build|B|H|Hkv|N|D|dtype|causal|mask",
    "build": "name in attnlab.builds.BUILDS (e.g. 'fused', 'fused-no_pv', 'sdpa_flash')",
    "family": "'ours', 'ablation' or 'library'",
    "base": "the build an ablation modifies (the build itself otherwise)",
    "ablation": "'no_softmax', 'no_pv', 'zero_mask' or '' for none",
    "B": "batch", "H": "query heads", "Hkv": "key/value heads (< H: grouped-query attention)",
    "N": "sequence length", "D": "head dim",
    "dtype": "'bfloat16', 'float16' or 'float32'",
    "causal": "bool; causal and non-causal rows never share a ratio",
    "mask": "'none' or 'zero' (the zero_mask ablation's all-zero additive mask)",
    "pass": "'forward', 'backward' (dQ, dK, dV from dO through torch.autograd, the forward outside the timed call) "
            "or 'forward+backward'; a file without the column holds forward rows",
    "device": "e.g. 'cuda:0' or 'cpu'",
    "device_name": "e.g. 'NVIDIA H200' or the CPU model",
    # outcome
    "status": "'ok', 'unsupported: <why>', 'oom: <bytes wanted>' or 'error: <message>'",
    "cold_s": "wall seconds of the very first call (compile, autotune, load), never mixed into warm numbers",
    "ms": "warm time, median over repetitions, milliseconds",
    "ms_p20": "20th percentile", "ms_p80": "80th percentile",
    "reps": "timed repetitions behind the median",
    "timer": "'do_bench+graph' (device events around CUDA-graph replays), 'do_bench' (eager: capture failed, "
             "timing_note says why) or 'perf_counter' (CPU)",
    "host_ms": "host wall time to issue one timed call without waiting (CUDA; NaN on CPU, where calls are synchronous)",
    "eager_ms": "the timed call issued eagerly from Python, back to back with no sync between, CUDA events around the "
                "window, per call: what a caller meets, launch cost included, beside `ms`'s graph replays, which "
                "hide it (CUDA; NaN on CPU, where `ms` is eager already)",
    "timing_note": "'' or why `ms` may not be the kernels' time: 'graph capture failed ...' (timed eagerly), and "
                   "then 'host-bound: ...' when issuing a call takes half the measured time or more (the GPU may "
                   "wait on Python, so `ms` overstates the kernels)",
    "sm_clock_mhz": "median SM clock (MHz) of the card, sampled every 50 ms while the case was timed (attnlab.telemetry; "
                    "NaN on a CPU or where the driver's NVML cannot be read)",
    "power_w": "median board power (W) NVML gave over the same samples (its reading is itself an average over up "
               "to a second, so short cases read low)",
    "clock_reasons": "every clock-event reason those samples gave, e.g. 'software power cap' (the clock held below "
                     "its maximum to stay under the card's power limit); '' for none or unknown",
    "peak_bytes": "peak allocation above what was allocated before the call (NaN where unknowable)",
    "peak_note": "why peak_bytes is NaN (e.g. 'n/a: CPU has no allocator statistics')",
    "hold_bytes": "predicted bytes the build must hold at once: O, plus S and P (materialised) or P (qk_softmax); "
                  "0 on a backward pass's row (the byte model counts the forward)",
    "held_bytes": "bytes the forward leaves allocated for the backward (what the build saved for it), its output and "
                  "inputs excluded: on CUDA memory allocated after the forward returns less before it, less the "
                  "output; on a CPU (no allocator statistics) the storages torch.autograd saved; NaN on a forward row",
    "alloc_flag": "'' or a warning that peak_bytes is below hold_bytes (a build that is not what its name says)",
    "err": "‖o − ref‖/‖ref‖ against the fp64 reference",
    "err_limit": "the FlashAttention-rule limit err must stay under (attnlab.accuracy)",
    "err_note": "e.g. 'reference on batch 0:1 of 4, heads 0:2 of 32'; 'FAILS accuracy rule: ...' when err > err_limit",
    "checksum": "float: the consumed-output checksum after the timed repetitions (proves the output was used): "
                "Σ o.sum() over every call of the timing phase (its warm-up too), read once, divided by the calls",
    "consume_ms": "median ms of the consumption step alone (o.sum into the checksum); it is inside ms, the same "
                  "for every build of a shape",
    "flops": "4·B·H·N²·D, halved for causal; ×2.5 for a backward pass, ×3.5 forward+backward (attnlab.cost)",
    "bytes_moved": "the fewest bytes this build must move through device memory (attnlab.cost); 0 on a backward "
                   "pass's row (the byte model counts the forward)",
    "tflops": "achieved TFLOP/s at the median less consume_ms (the attention alone)",
    "tbps": "achieved TB/s at the median less consume_ms",
    "pct_flops": "tflops as % of the run's measured matmul ceiling",
    "pct_bw": "tbps as % of the run's measured copy-bandwidth ceiling",
    "ceiling_tflops": "the run's measured matmul rate in this dtype, TFLOP/s",
    "ceiling_tbps": "the run's measured device-to-device copy bandwidth (read + written), TB/s",
    "tiles": "JSON of the tile configuration each of our kernels used ('' for library rows)",
    "compile_note": "for compiled rows: '' or what torch._dynamo did (e.g. recompile-limit fallback refused)",
    "started": "ISO time the case began",
    "code": "fingerprint of the attnlab sources that measured the row (provenance.code_hash): a table notes a ratio "
            "whose two rows were measured by different code",
}

# Columns added after results files were first written: a file without them (and otherwise of this schema) is
# still read, these columns then unknown; a sweep does not append to it (attnlab.sweep.read_results, run).
LATER = ("sm_clock_mhz", "power_w", "clock_reasons", "eager_ms")

# The passes a row may time, and the columns a backward pass needs: a file without them holds forward rows, with
# nothing held for a backward (the value each reads as, as written in a file).
PASSES = ("forward", "backward", "forward+backward")
BEFORE_BACKWARD = {"pass": "forward", "held_bytes": "nan"}

# The type of every column, for writing and reading results files (attnlab.sweep.read_results). "int" columns are
# always known (reps is 0 when nothing was timed); unknown "float"s are NaN; unknown "str"s are ''.
TYPES = {
    **{c: "str" for c in ("run_id", "case_id", "build", "family", "base", "ablation", "dtype", "mask", "device",
                          "device_name", "status", "timer", "peak_note", "alloc_flag", "err_note", "tiles",
                          "compile_note", "started", "code", "timing_note", "clock_reasons", "pass")},
    **{c: "int" for c in ("B", "H", "Hkv", "N", "D", "reps", "hold_bytes", "flops", "bytes_moved")},
    **{c: "float" for c in ("host_ms", "eager_ms", "cold_s", "ms", "ms_p20", "ms_p80", "consume_ms", "peak_bytes",
                            "held_bytes", "err", "err_limit",
                            "checksum", "tflops", "tbps", "pct_flops", "pct_bw", "ceiling_tflops", "ceiling_tbps",
                            "sm_clock_mhz", "power_w")},
    "causal": "bool",
}
assert set(TYPES) == set(COLUMNS), set(TYPES) ^ set(COLUMNS)


def recorded_tiles(tiles_json) -> dict:
    """A result row's recorded tiles (the JSON of attnlab.triton.launch.tile_config) as {kernel: tiles dict}; {} where
    the row records none (a library build, an older run)."""
    try:
        recorded = json.loads(tiles_json)
    except (TypeError, ValueError):
        return {}
    return {k: t for k, t in recorded.items() if isinstance(t, dict)} if isinstance(recorded, dict) else {}


def kernel_label(tiles_json, kernel: str | None = "fused") -> str:
    """'gluon' or 'triton': which kernel of that name ran (fused, or qk_softmax's P kernel), from a result row's
    recorded tiles (recorded_tiles); with kernel=None, 'gluon' when any of the row's kernels is a Gluon one. '' when
    the row records no such tiles."""
    recorded = recorded_tiles(tiles_json)
    picked = list(recorded.values()) if kernel is None else [recorded[kernel]] if kernel in recorded else []
    if not picked:
        return ""
    return "gluon" if any(t.get("gluon") for t in picked) else "triton"


def forward_rows(results):
    """The rows of the forward pass: what every table and figure of the lab compares (a backward row beside a forward
    one of the same case would be two rows for one key). A row that names no pass, and a table without the column,
    are the forward's (BEFORE_BACKWARD)."""
    if "pass" not in results:
        return results
    return results[~results["pass"].isin([p for p in PASSES if p != "forward"])]


def less_consumption(ms: float, consume_ms: float) -> float:
    """The attention's own time: the median less the consumption step timed alone (which is inside every `ms`).
    Differences between builds cancel the step anyway; rates and ratios must not carry it (up to 20 % of a fused
    call at N = 512 on the H200). Kept as `ms` where the step's time is unknown or not below it."""
    if isinstance(consume_ms, float) and math.isfinite(consume_ms) and 0 < consume_ms < ms:
        return ms - consume_ms
    return ms
