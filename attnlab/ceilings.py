"""The device's own ceilings, measured now, against which achieved rates are stated: copy bandwidth and matmul rate."""
from __future__ import annotations

import statistics
import time

import torch

from attnlab.telemetry import LoadLog

GiB = 1 << 30


def cpu_times_ms(fn, reps: int = 5) -> list[float]:
    """ms of each of `reps` calls of fn() by perf_counter, after one warm-up call."""
    fn()  # warm-up: first-touch page faults and thread-pool start are not the rate
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def cpu_median_ms(fn, reps: int = 5) -> float:
    return statistics.median(cpu_times_ms(fn, reps))


def _cuda_median_ms(fn) -> float:
    import triton.testing

    # A long warm-up: an idle GPU's SM clock starts low (345 MHz on an H200) and a ceiling must be the ramped rate.
    return statistics.median(triton.testing.do_bench(fn, warmup=200, rep=200, return_mode="all"))


def measure_ceilings(device, dtype) -> dict:
    """The device's own copy bandwidth and matmul rate, measured now, never a datasheet constant.

    Bandwidth: one large device-to-device copy, counting bytes read plus bytes written (2 × size), so that a
    kernel's bytes_moved / time compares with it directly. Matmul: a square product in the run's dtype (fp32 with
    torch's default, i.e. no TF32). On CUDA the copy is 1 GiB (far past any L2) and the product 8192³, timed by
    do_bench; on CPU small versions (32 MiB, 512³, perf_counter medians) keep it under a couple of seconds.
    copy_mhz and matmul_mhz: the median SM clock while each was timed (attnlab.telemetry; None without a GPU), since a
    card at its power limit runs each workload at a clock of its own.
    """
    device = torch.device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    cuda = device.type == "cuda"
    copy_bytes = GiB if cuda else 32 << 20
    n = 8192 if cuda else 512
    src = torch.randn(copy_bytes // 4, device=device)  # random, not zeros: nothing gets to compress or skip
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    timer = _cuda_median_ms if cuda else cpu_median_ms
    with LoadLog(device) as log:  # the clock each was measured at: a build drawing more power runs at a lower one
        t0 = time.time()
        copy_ms = timer(lambda: dst.copy_(src))
        t1 = time.time()
        mm_ms = timer(lambda: torch.mm(a, b))
        t2 = time.time()
        clocks = dict(copy_mhz=log.window(t0, t1)["sm_clock_mhz"], matmul_mhz=log.window(t1, t2)["sm_clock_mhz"])
    clocks = {k: v if v == v else None for k, v in clocks.items()}  # None, not NaN: provenance.json stays JSON
    del src, dst, a, b
    if cuda:
        torch.cuda.empty_cache()
    return dict(
        tbps=2 * copy_bytes / (copy_ms * 1e-3) / 1e12,
        tflops=2 * n**3 / (mm_ms * 1e-3) / 1e12,
        copy_bytes=copy_bytes,
        matmul_n=n,
        dtype=str(dt).removeprefix("torch."),
        device=str(device),
        timer="do_bench" if cuda else "perf_counter",
        **clocks,
    )
