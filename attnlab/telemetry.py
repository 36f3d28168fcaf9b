"""What the card was doing while a case was timed: its SM clock, its power draw and why its clock was held down.

    with LoadLog(device) as log:          # samples every 50 ms in a thread (NVML, the driver's own library)
        t0 = time.time(); ...timed...; t1 = time.time()
        row.update(log.window(t0, t1))    # sm_clock_mhz, power_w, clock_reasons of the samples in [t0, t1]

Why: a card at its power limit lowers its clock, and builds differ in how much power they draw. On the H200 every
build replayed back to back sits at the software power cap (≈ 690 W), and the qk_softmax build, whose P stores and
matmuls draw the most, runs at a median 1485 MHz against fused's 1590 and cuDNN's 1620, of a 1980 MHz maximum. A
ratio between two builds is then partly a ratio of clocks; the rows say so instead of leaving it to be guessed. Where
NVML cannot be read (a CPU, no driver), the log is inert and the columns are NaN and ''.
"""
from __future__ import annotations

import ctypes
import math
import statistics
import threading
import time

import torch

# NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*), by the names nvidia-smi prints
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
           0x10: "sync boost", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
           0x80: "hardware power brake", 0x100: "display clock"}
NVML_CLOCK_SM = 1


def reason_names(bits: int) -> str:
    """'software power cap + hardware slowdown' for 0xC; '' for 0."""
    return " + ".join(name for bit, name in REASONS.items() if bits & bit)


def summarise(samples: list) -> dict:
    """Median SM clock (MHz) and power (W) of (time, clock, watts, reason bits) samples, and every reason any of them
    gave; NaN and '' without samples."""
    if not samples:
        return dict(sm_clock_mhz=math.nan, power_w=math.nan, clock_reasons="")
    bits = 0
    for s in samples:
        bits |= s[3]
    return dict(sm_clock_mhz=float(statistics.median(s[1] for s in samples)),
                power_w=float(statistics.median(s[2] for s in samples)), clock_reasons=reason_names(bits))


def nvml_handle(index: int):
    """(NVML's library, the handle of GPU `index`), or (None, the reason NVML cannot be read)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return None, f"NVML: {e}"
    if lib.nvmlInit_v2() != 0:
        return None, "NVML: nvmlInit_v2 failed"
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return None, f"NVML: no device {index}"
    return lib, handle


def nvml_reader(index: int):
    """A function returning (SM clock MHz, power W, clock-event reason bits) of GPU `index` from NVML, or None with
    the reason it cannot be read."""
    lib, handle = nvml_handle(index)
    if lib is None:
        return None, handle
    # renamed in CUDA 12.x drivers; older ones have only the "throttle" name
    reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def read():
        clock, mw, bits = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        ok = (lib.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) == 0
              and lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(mw)) == 0
              and reasons(handle, ctypes.byref(bits)) == 0)
        return (clock.value, mw.value / 1000.0, bits.value) if ok else None

    return read, ""


class LoadLog:
    """Samples the card every `period_ms` in a thread for as long as it is open (a context manager). `reader`: a
    function returning (clock MHz, watts, reason bits) or None, for tests; by default NVML's, on CUDA only."""

    def __init__(self, device, period_ms: float = 50.0, reader=None):
        self.period = period_ms / 1000.0
        self.samples: list = []
        self.note = ""
        self._stop = threading.Event()
        self._thread = None
        self._read = reader
        dev = torch.device(device)
        if reader is None:
            if dev.type != "cuda" or not torch.cuda.is_available():
                self.note = "no GPU: nothing to sample"
            else:
                self._read, self.note = nvml_reader(dev.index if dev.index is not None else torch.cuda.current_device())

    def __enter__(self):
        if self._read is not None:
            self._thread = threading.Thread(target=self._run, name="attnlab-load", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.period + 1)
        return False

    def _run(self):
        while not self._stop.is_set():
            t = time.time()
            got = self._read()
            if got is not None:
                self.samples.append((t, *got))
            self._stop.wait(self.period)

    def window(self, t0: float, t1: float) -> dict:
        """summarise() of the samples taken between time.time() stamps t0 and t1 (waiting up to two periods for the
        sample that closes the window)."""
        if self._thread is not None:
            deadline = time.time() + 2 * self.period
            while (not self.samples or self.samples[-1][0] < t1) and time.time() < deadline:
                time.sleep(self.period / 5)
        return summarise([s for s in list(self.samples) if t0 <= s[0] <= t1])
