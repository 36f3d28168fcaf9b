"""Stage times only where stages are separate kernels; the fused kernel's insides are refused."""
import pytest
import torch

from attnlab import kernels


def test_materialised_and_qk_softmax_stages_come_from_their_kernels():
    t = kernels.stage_table({"scores_kernel": 1.0, "softmax_kernel": 2.0, "pv_kernel": 1.0, "other": 9.0},
                            "materialised")
    assert list(t.kernel) == ["scores_kernel", "softmax_kernel", "pv_kernel"]
    assert list(t.ms) == [1.0, 2.0, 1.0] and list(t.share) == [0.25, 0.5, 0.25]
    t = kernels.stage_table({"qk_softmax_kernel": 3.0, "pv_kernel": 1.0}, "qk_softmax")
    assert list(t.share) == [0.75, 0.25]
    # the Gluon P kernel, and the Triton kernel's re-write of flagged rows after it (Tiles.fixed_reference): one stage
    t = kernels.stage_table({"qk_softmax_gluon_kernel": 2.5, "qk_softmax_kernel": 0.5, "pv_kernel": 1.0}, "qk_softmax")
    assert list(t.kernel) == ["qk_softmax_gluon_kernel + qk_softmax_kernel", "pv_kernel"]
    assert list(t.ms) == [3.0, 1.0]
    with pytest.raises(ValueError, match="not an ablation"):  # its kernels are not the stages the labels name
        kernels.stage_table({"qk_softmax_kernel": 3.0, "pv_kernel": 1.0}, "qk_softmax-no_pv")


@pytest.mark.parametrize("build", ["fused", "fused-no_softmax", "fused-zero_mask"])
def test_the_fused_kernels_stages_are_refused_and_the_ablations_named(build):
    with pytest.raises(kernels.StagesNotSeparable, match="ablation_table"):
        kernels.stage_table({"fused_kernel": 1.0}, build)


def test_missing_kernels_and_library_builds_are_clear_errors():
    with pytest.raises(ValueError, match="lacks softmax_kernel, pv_gluon_kernel or pv_kernel for materialised"):
        kernels.stage_table({"scores_kernel": 1.0}, "materialised")
    with pytest.raises(ValueError, match="got 'sdpa_flash'"):
        kernels.stage_table({}, "sdpa_flash")


def test_the_stage_table_names_the_kernels_the_launchers_launch():
    """If a kernel is renamed, the mapping must follow: the names are the Triton functions' own."""
    from attnlab.triton import materialised, pv, pv_gluon, qk_softmax, qk_softmax_gluon

    launched = {materialised.scores_kernel.__name__, materialised.softmax_kernel.__name__, pv.pv_kernel.__name__,
                pv_gluon.pv_gluon_kernel.__name__, qk_softmax.qk_softmax_kernel.__name__,
                qk_softmax_gluon.qk_softmax_gluon_kernel.__name__}
    assert {k for stages in kernels.STAGES.values() for names, _ in stages for k in names} == launched


def test_kernel_times_needs_cuda():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        kernels.kernel_times("materialised", q, q, q)
