"""Kernel resources read offline: compiled for sm_90a on this CPU machine by Triton's bundled ptxas.

The compile runs in a child process started with TRITON_INTERPRET=0 (this test process has our kernels loaded for
the interpreter), exactly as a user's `python -m attnlab.triton.resources` does.
"""
import pytest

from attnlab.triton import config, resources
from tests.conftest import offline_compile


def test_the_candidate_that_failed_on_the_h200_is_seen_not_to_fit():
    """fused 128×128 w8 s3 at D = 128 with a mask tile could not launch on the H200 (out of shared memory);
    the offline compile must say so, and the table's 128×64 must fit."""
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
    """The advisory that explained the slow causal paired kernel (PERFORMANCE.md v8) must come out as a flag."""
    report = """ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non
wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the
function 'fused_kernel'
ptxas info    : Used 255 registers, used 1 barriers, 88 bytes cumulative stack size
ptxas info    : 136 bytes spill stores, 188 bytes spill loads"""
    assert resources.read_ptxas(report) == dict(registers=255, stack_bytes=88, spill_stores=136, spill_loads=188,
                                                wgmma_serialised=True)
    assert resources.read_ptxas("ptxas info    : Used 126 registers")["wgmma_serialised"] is False
    # the other wording (a register of an in-flight matmul read: the first qk_softmax Gluon kernel, PERFORMANCE.md v12)
    c7514 = """ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non
wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage"""
    assert resources.read_ptxas(c7514)["wgmma_serialised"] is True


@pytest.mark.parametrize("n,entries", [
    (4096, ["64x128w4s2gmco", "64x128w4s2hgmco", "64x128w4s2gmco", "64x128w4s2hgmco"]),  # TABLE
    (512, ["64x128w4s2gmco", "64x128w4s2hgmcou", "64x128w4s2gmco", "64x64w4s2hgmcou"]),  # SHORT (below 1448, 724)
])
def test_the_tables_fused_entries_fit_and_keep_their_matmuls_asynchronous(n, entries):
    """Every sm90 fused entry of the tile tables (D 64 and 128, causal and not, with and without the zero_mask
    ablation's additive mask; TABLE's at N = 4096, SHORT's at 512) compiles within shared memory, with no wgmma
    serialisation and no spills without the mask but the persistent causal kernel's 4 bytes at D = 128 (8 bytes of
    stack since v18, the same before and after v24's pair order; its times in PERFORMANCE.md v24 include them); with
    the mask the Gluon kernel spills some (tests/test_fused_gluon.py). One-consumer programs (`u`) take at most half
    an SM's shared memory, so two share it."""
    rows = offline_compile("--kernels", "fused", "--head-dims", "64,128", "--causal", "0,1", "--masks", "0,2",
                           "--n", str(n))
    assert len(rows) == 8  # no mask, and the additive mask the zero_mask ablation passes
    for r in rows:
        assert r["fits"] and not r["wgmma_serialised"], r
        if r["mask_kind"]:  # the one-item Gluon kernel a few bytes, the persistent one 536–700 (v18)
            allowed = 704 if "c" in r["tiles"] else 256
        else:
            allowed = 4 if (r["D"], r["causal"], r["tiles"]) == (128, True, "64x128w4s2hgmco") else 0
        assert r["spill_stores"] <= allowed, r
        if r["tiles"].endswith("u"):
            assert (r["smem_kib"] + 1) * 2 <= 228, r  # with the 1 KiB each block reserves
    assert [r["tiles"] for r in rows[::2]] == entries
