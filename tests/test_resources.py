"""Kernel resources read offline: compiled for sm_90a on this CPU machine by Triton's bundled ptxas.

The compile runs in a child process started with TRITON_INTERPRET=0 (this test process has our kernels loaded for
the interpreter), exactly as a user's `python -m attnlab.triton.resources` does.
"""
import pytest
import torch

from attnlab.triton import config, plan, resources
from attnlab.triton.hopper import common
from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
from attnlab.triton.hopper import qk_softmax_row
from attnlab.triton.layout import mask_layout
from tests.conftest import offline_compile
from tests.offline import compiles


def test_the_command_sees_a_candidate_that_does_not_fit():
    """`python -m attnlab.triton.resources` as a user runs it (it restarts itself with TRITON_INTERPRET=0): fused
    128×128 w8 s3 at D = 128 with a mask tile could not launch on the H200 (out of shared memory), and the offline
    compile must say so; 128×64 fits."""
    bad, good = offline_compile("--kernels", "fused", "--head-dims", "128", "--causal", "0", "--masks", "2", "--tiles",
                                "128x128w8s3,128x64w8s3", timeout=300)
    assert (bad["tiles"], good["tiles"]) == ("128x128w8s3", "128x64w8s3")
    assert bad["smem_kib"] == 288 and not bad["fits"]  # exactly what the H200's launch asked for
    assert good["fits"] and good["smem_kib"] < 227 and good["spill_stores"] == 0
    assert not good["wgmma_serialised"]


def test_compiling_interpreter_kernels_in_process_is_refused_with_the_way_out():
    if not config.interpreting():
        pytest.skip("kernels are real JIT functions here")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        resources.compile_info("pv", 64, False, config.Tiles(128, 64, 8, 3))


def test_tiles_parse_and_a_bad_entry_is_one_clear_error(capsys):
    assert resources.parse_tiles("128x64w8s3h") == config.Tiles(128, 64, 8, 3, heavy_first=True)
    assert resources.parse_tiles("64x128w4s3gr") == config.Tiles(64, 128, 4, 3, gluon=True, q_registers=True)
    for label in ("128x64w8s3", "128x64w8s3h", "128x64w8s3p", "128x64w8s3hp", "64x128w4s2hg", "64x128w4s2gm",
                  "64x128w4s3hgr", "128x64w4s4gcy"):
        assert resources.label(resources.parse_tiles(label)) == label  # the labels rows and logs print
    with pytest.raises(ValueError, match="look like 128x64w8s3"):
        resources.parse_tiles("128-64")
    assert resources.main(["--tiles", "128-64"]) == 2
    assert "attnlab resources: error: --tiles entries look like" in capsys.readouterr().err


def test_the_compile_is_specialised_like_the_jit():
    """Ints equal to 1 become constants (GROUP; a broadcast mask's unit stride), multiples of 16 are marked so."""
    with_mask = resources._int_args(128, mask_kind=2)
    assert (with_mask["smn"], with_mask["smm"], with_mask["GROUP"], with_mask["H"]) == (1, 4096, 1, 16)
    assert resources._int_args(64, mask_kind=0)["smn"] == 0 and resources._int_args(64, 0)["sqn"] == 64


def test_bad_flags_are_one_clear_error(capsys):
    assert resources.main(["--flags", "NO_PV"]) == 2
    assert "--flags looks like NO_PV=1" in capsys.readouterr().err


def test_ptxas_report_is_read_including_the_wgmma_serialisation_advisory():
    """The advisory that explained the slow causal paired kernel must come out as a flag."""
    report = """ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non
wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the
function 'fused_kernel'
ptxas info    : Used 255 registers, used 1 barriers, 88 bytes cumulative stack size
ptxas info    : 136 bytes spill stores, 188 bytes spill loads"""
    assert resources.read_ptxas(report) == dict(registers=255, stack_bytes=88, spill_stores=136, spill_loads=188,
                                                wgmma_serialised=True)
    assert resources.read_ptxas("ptxas info    : Used 126 registers")["wgmma_serialised"] is False
    # the other wording (a register of an in-flight matmul read: the first qk_softmax Gluon kernel)
    c7514 = """ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non
wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage"""
    assert resources.read_ptxas(c7514)["wgmma_serialised"] is True


# The N at which the rules' sm90 choices are compiled: the benchmark's 4096 for the long-sequence ones, else the
# longest multiple of 16 below a bound the rules read (a one-pass choice's row then fills the most shared memory it
# can): the first of these that gives the choice; None, the long-sequence choice wherever it starts (the Gluon PV
# kernel's at D = 64 causal, from 8192), at 4096
SERVED_NS = (4096, 4080, 2032, 1440, 1024, 720, None)


def _rules_compiles() -> list:
    """For every sm90 16-bit choice of fused, qk_softmax and pv the rules make (attnlab.triton.plan: at D = 64 and 128,
    the Triton P kernel's there too, which runs below the Gluon one's N, and at D = 48, 96 and fused's 192 for their
    buckets) at an N it serves (SERVED_NS, the first that gives it): the compiles of what the lab's calls run with
    it. A Gluon choice: the build unmasked and its ablations (no_softmax, no_pv: the PV kernel's flag), the
    zero_mask ablation's additive mask and a user's boolean one (for qk_softmax the tiles qk_softmax_gluon.as_run gives
    a masked call: the one-pass kernel and the fixed reference take no mask). A Triton choice: the build and its
    zero_mask ablation."""
    out, seen = [], set()
    for kernel in ("fused", "qk_softmax", "pv"):
        dims = [(64, True), (128, True), (48, True), (96, True)]
        dims += [(64, False), (128, False)] if kernel == "qk_softmax" else [(192, True)] if kernel == "fused" else []
        for D, gluon in dims:
            for c in (False, True):
                for n in SERVED_NS:
                    t = plan.lookup(kernel, "sm90", D, c, 2, gluon, n)
                    n = n or 4096
                    if (kernel, D, c, t) in seen:
                        continue
                    seen.add((kernel, D, c, t))
                    label = resources.label(t)
                    if kernel == "pv":
                        out += compiles("pv", D, c, label, n=n)
                        if t.gluon:
                            out += compiles("pv", D, c, label, n=n, flags={"NO_PV": True})
                        continue
                    out += compiles(kernel, D, c, label, n=n)
                    if t.gluon:  # the Triton choices: the build and its zero_mask ablation
                        out += compiles(kernel, D, c, label, n=n, flags={"NO_SOFTMAX": True})
                    if kernel == "fused" and t.gluon:
                        out += compiles(kernel, D, c, label, n=n, flags={"NO_PV": True})
                    for mask_kind, dtype in ((1, torch.uint8), (2, torch.bfloat16))[0 if t.gluon else 1:]:
                        mask = torch.empty(n, n, dtype=dtype, device="meta").expand(1, 2048 // D, n, n)
                        ran = qk_softmax_gluon.as_run(t, mask_layout(mask, mask_kind), D, 2, n) if (
                            kernel == "qk_softmax" and t.gluon) else t
                        out += compiles(kernel, D, c, resources.label(ran), masks=mask_kind, n=n)
    return out


RULES_COMPILES = _rules_compiles()


@pytest.mark.parametrize("offline", [RULES_COMPILES], ids=["sm90"], indirect=True)
def test_every_sm90_choice_of_the_rules_compiles_within_limits_on_every_path_the_lab_runs(offline):
    """Whatever the rules say, each sm90 16-bit choice of fused, qk_softmax and pv compiles for sm_90a within a
    program's share of shared memory (one-consumer programs: half an SM, so two share it) on every path the lab runs
    it (_rules_compiles). The Gluon choices, tuned on the H200, also keep their matmuls asynchronous (no
    C7514/C7515) and spill nothing without a mask (the benchmark's path) but for the persistent fused kernel's few
    bytes under a causal mask at D = 128 and its no_softmax ablation's at most 256; a mask costs the fused kernel at
    most 704 bytes (the consumers' 64-bit mask pointers), the P kernel 128. A one-pass choice's row buffers fit
    beside its ring at the N it serves (qk_softmax_row.fits)."""
    assert len(offline) == len(RULES_COMPILES) > 0
    wrong = []
    for c, r in zip(RULES_COMPILES, offline):
        t = resources.parse_tiles(r["tiles"])
        if not r["fits"] or (t.one_consumer and r["smem_kib"] * 1024 > common.smem_limit(t)):
            wrong.append(f"{c}: {r['smem_kib']:.0f} KiB does not fit")
        if not t.gluon:
            continue
        if r["mask_kind"]:
            allowed = 704 if r["kernel"] == "fused" else 128
        elif r["kernel"] == "fused" and t.persistent and r.get("NO_SOFTMAX"):
            allowed = 256
        else:
            allowed = 4 if (r["kernel"], t.persistent, r["causal"], r["D"]) == ("fused", True, True, 128) else 0
        if r["wgmma_serialised"] or r["spill_stores"] > allowed:
            wrong.append(f"{c}: {r['spill_stores']} bytes spilled (at most {allowed}), wgmma serialised: "
                         f"{r['wgmma_serialised']}")
    assert not wrong, "\n".join(wrong)
    for c in RULES_COMPILES:
        t = resources.parse_tiles(c.tiles)
        if t.one_pass and not c.mask_kind:
            assert qk_softmax_row.fits(t, c.n, c.D, 2), c
