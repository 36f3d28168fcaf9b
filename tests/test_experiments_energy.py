"""The CPU-side arithmetic of the energy diagnostics: energy_probe.py's summary (session 19, PERFORMANCE.md v35), which
turns NVML energy a call into the derivation the performance log quotes, p_energy.py's lines (session 23, Next 12),
and ncu_stalls.py's reading of Nsight Compute's per-instruction stall samples. Their GPU halves ran on the H200
(outputs/h200/2026-12-01-s19-call1, -call2; -s23-call5)."""
import collections
import gzip
import json
import sys
from pathlib import Path

import pytest
import torch

from attnlab.bench import qk_softmax_floor_ms

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "experiments"))

import energy_probe  # noqa: E402
import ncu_stalls  # noqa: E402
import p_energy  # noqa: E402


def _rows(idle_w=100.0):
    """Round figures: 1 pJ/FLOP for the product, 50 pJ/B for zero_, and a D = 128 case whose parts are known."""
    flops, p_bytes = 2 * 10**12, 10**9  # 2 TFLOP of QKᵀ, 1 GB of P
    shape = dict(D=128, N=4096, B=4, H=16, qk_flops=flops, p_bytes=p_bytes)

    def at(ms, dyn_mj, watts=700.0, **extra):  # mJ a call = dynamic + idle W × ms
        return dict(ms=ms, mj=dyn_mj + idle_w * ms, watts=watts, mhz=1500.0, **extra)

    return [dict(phase="idle", watts=idle_w),
            dict(phase="mm", **at(1.0, 1000.0, flops=10**12)),  # 1000 mJ / 1e12 FLOP = 1 pJ/FLOP
            dict(phase="copy", **at(1.0, 100.0, watts=400.0, bytes=2 * 10**9)),
            dict(phase="zero", **at(1.0, 50.0, watts=400.0, bytes=10**9)),  # 50 pJ/B
            dict(phase="qk_softmax", **at(10.0, 6000.0, **shape)),
            dict(phase="fused", **at(5.0, 3000.0, **shape)),
            dict(phase="sdpa_cudnn", **at(5.0, 3000.0, **shape)),
            dict(phase="p_kernel", **at(7.0, 4000.0, **shape)),
            dict(phase="p_kernel-no_softmax", **at(4.0, 2500.0, **shape)),
            dict(phase="pv_kernel", **at(3.0, 2100.0, **shape)),
            dict(phase="idle", watts=idle_w + 5)]


def test_energy_summary_derives_the_v35_figures(capsys):
    """Dynamic energy subtracts the lowest idle draw; the P kernel's parts are 2 × QKᵀ + P written; the unavoidable
    energy is 3 × QKᵀ + P written + the PV kernel's read (PV − one QKᵀ); time at the build's own draw over the floor."""
    ceil = dict(tflops=500.0, tbps=4.0)
    energy_probe.summarise(_rows(), ceil)
    out = capsys.readouterr().out
    assert "mm 1.000 pJ/FLOP" in out and "zero 50.0 pJ/B" in out
    # QKᵀ = 2e12 FLOP × 1 pJ = 2000 mJ; P written = 1e9 B × 50 pJ = 50 mJ
    assert "build 6000 = P 4000 + PV 2100 (6100)" in out
    assert "P kernel's parts 2·QKᵀ 4000 + write 50 = 4050; no_softmax 2500" in out
    unavoidable = 3 * 2000 + 50 + (2100 - 2000)  # 6150 mJ at the build's 600 W dynamic draw
    floor = qk_softmax_floor_ms(4, 16, 4096, 128, torch.bfloat16, False, ceil)
    assert f"floor {floor:.3f} ms, build {10.0 / floor:.3f}x" in out
    assert f"unavoidable {unavoidable} mJ at 600 W = {unavoidable / 600:.3f} ms" in out
    assert f"1.25x the floor allows {1.25 * floor * 600:.0f} mJ" in out


def test_energy_summary_reads_the_committed_h200_log(capsys):
    """The committed call-1 log still parses and gives the figures PERFORMANCE.md v35 quotes for it."""
    log = ROOT / "outputs/h200/2026-12-01-s19-call1/energy.log"
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"phase"')]
    energy_probe.summarise(rows, dict(tflops=671.2, tbps=4.245))  # session 17's bench ceilings, bf16
    out = capsys.readouterr().out
    assert "build 1054 = P 707 + PV 336 (1043)" in out
    assert "P kernel's parts 2·QKᵀ 437 + write 125 = 561" in out
    assert "(1.149x the floor); 1.25x the floor allows 976 mJ" in out


HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
          "stall_mio", "stall_barrier", "stall_wait (Not Issued)"]


def _report(tmp_path):
    """Two profiles of one kernel and one of another; in the second profile of `k` a loop body run 1000 times."""
    lines = ['"Kernel Name","k",', ",".join(f'"{h}"' for h in HEADER),
             '"0x1","MUFU.EX2 R1, R1","9","500","9","0","0","9"',
             '"Kernel Name","other",', ",".join(f'"{h}"' for h in HEADER),
             '"0x2","FADD R1, R1, R2","5","1000","5","0","0","5"',
             '"Kernel Name","k",', ",".join(f'"{h}"' for h in HEADER),
             '"0x10","LDC R1, c[0x0][0x28]","4","8","0","0","4","0"',
             '"0x20","MUFU.EX2 R2, R2","6","1000","4","2","0","4"',
             '"0x30","@!P0 BRA 0x40","3","1000","0","0","3","0"',
             '"0x40","FFMA R3, R2, R4, -R5","1","1000","1","0","0","1"']
    path = tmp_path / "ncu_sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_ncu_stalls_picks_the_profile_and_the_loop(tmp_path, capsys, monkeypatch):
    path = _report(tmp_path)
    rows, stalls = ncu_stalls.read(str(path), "k", 1)
    assert [r["Address"] for r in rows] == ["0x10", "0x20", "0x30", "0x40"]  # the second profile of k only
    assert stalls == ["stall_wait", "stall_mio", "stall_barrier"]  # "(Not Issued)" columns left out
    assert ncu_stalls.opcode("@!P0 BRA 0x40") == "BRA" and ncu_stalls.opcode("MUFU.EX2 R2, R2") == "MUFU"
    monkeypatch.setattr(sys, "argv", ["ncu_stalls.py", str(path), "k", "--occurrence", "1", "--min-instructions", "2"])
    ncu_stalls.main()
    out = capsys.readouterr().out
    assert "k #1: 4 instructions, 14 samples; barrier 0.50, wait 0.36, mio 0.14" in out
    assert "executed 1000 times: 3 instructions, 10 samples (0.71 of all)" in out
    assert "MUFU          1 instructions 0.600 of the loop's samples: wait 0.67, mio 0.33" in out
    assert "BRA           1 instructions 0.300 of the loop's samples: barrier 1.00" in out


def test_ncu_stalls_says_when_the_profile_or_the_loop_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="no profile 2 of k"):
        ncu_stalls.read(str(_report(tmp_path)), "k", 2)
    with pytest.raises(SystemExit, match="shared by 4 instructions: pass --executions"):
        ncu_stalls.loop_count(collections.Counter({"1000": 3, "8": 1}), 4)


def test_p_energy_lines_subtract_the_idle_draw():
    """dyn mJ = mJ a call − idle W × ms a call (W × ms = mJ), rounded; the rest as measured."""
    row = dict(phase="D=64 table", ms=2.0, mj=1500.0, watts=700.4, mhz=1920.0, reasons="software power cap")
    assert p_energy.line(row, 100.0) == "D=64 table: 2.0000 ms, 1300 dyn mJ, 700 W, 1920 MHz, software power cap"


def test_p_energy_reproduces_the_committed_h200_lines():
    """The lines of session 23's call 5 (PERFORMANCE.md Next 12 quotes them) follow from its json rows."""
    text = (ROOT / "outputs/h200/2026-12-01-s23-call5/p_energy.log").read_text().splitlines()
    rows = [json.loads(x) for x in text if x.startswith("{")]
    printed = [x for x in text if x.startswith("D=")]
    idle = next(r for r in rows if r["phase"] == "idle")
    assert printed == [p_energy.line(r, idle["watts"]) for r in rows if r["phase"] != "idle"]
    assert len(printed) == 5 and "1113 dyn mJ" in printed[3]
