"""Stage times only where stages are separate kernels; the fused kernel's insides are refused."""
import importlib
import pkgutil

import pytest
import torch

from attnlab import profiler as kernels


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


def _defined_kernels() -> set[str]:
    """Every kernel attnlab.triton's modules and subpackages define (a Triton or Gluon JIT function named *_kernel),
    found by walking the package, so that a kernel added later cannot be missed as a hand-kept list would miss it."""
    import attnlab.triton as package

    found = set()
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        found |= {name for name, obj in vars(module).items()
                  if name.endswith("_kernel") and callable(getattr(obj, "fn", None))
                  and obj.fn.__module__ == module.__name__}
    return found


def test_every_kernel_is_a_stage_or_a_whole_build():
    """If a kernel is added or renamed, the mapping must follow: the names are the Triton functions' own."""
    staged = {k for stages in kernels.STAGES.values() for names, _ in stages for k in names}
    defined = _defined_kernels()
    assert {"qk_softmax_row_kernel", "qk_softmax_gluon_kernel", "pv_gluon_kernel", "pv_kernel"} <= defined  # it walks
    assert not staged & set(kernels.UNSTAGED) and not (staged | set(kernels.UNSTAGED)) & set(kernels.BACKWARD)
    assert staged | set(kernels.UNSTAGED) | set(kernels.BACKWARD) == defined


def test_the_one_pass_p_kernel_is_the_p_stage():
    t = kernels.stage_table({"qk_softmax_row_kernel": 0.2, "pv_kernel": 0.1}, "qk_softmax")
    assert list(t.kernel) == ["qk_softmax_row_kernel", "pv_kernel"]
    assert t.ms.tolist() == [0.2, 0.1]


@pytest.mark.parametrize("name", kernels.UNSTAGED)
def test_a_whole_build_kernel_has_no_stage_table(name):
    with pytest.raises(ValueError, match="lacks"):
        kernels.stage_table({name: 1.0}, "qk_softmax")


def test_kernel_times_needs_cuda():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        kernels.kernel_times("materialised", q, q, q)
