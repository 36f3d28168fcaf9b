"""Bad input gets one clear ValueError naming the argument, its value and the constraint: never a Triton error."""
import pytest
import torch

from attnlab import builds, reference, validate
from attnlab.triton import launch
from tests.conftest import rand_qkv

CHECKED = list(builds.OURS) + ["fused-no_pv", "torch_eager", "sdpa_math", "flex"]


def _bad_cases():
    q, k, v = rand_qkv(B=2, H=4, Hkv=2, N=16, D=32)
    return {
        "q not 4-d": ((q[0], k, v, {}), r"q must have 4 dimensions .* got shape \(4, 16, 32\)"),
        "k/v shapes differ": ((q, k, v[:, :1], {}), r"k and v must have the same shape"),
        "batch mismatch": ((q, k[:1], v[:1], {}), r"k.shape\[0\] \(batch\) must equal q.shape\[0\] = 2, got 1"),
        "N mismatch": ((q, k[:, :, :8], v[:, :, :8], {}), r"k.shape\[2\] .* must equal q.shape\[2\] = 16, got 8"),
        "D mismatch": ((q, k[..., :16], v[..., :16], {}), r"k.shape\[3\] \(head dim\) must equal q.shape\[3\] = 32"),
        "N = 0": ((q[:, :, :0], k[:, :, :0], v[:, :, :0], {}), r"sequence length q.shape\[2\] must be >= 1, got 0"),
        "D too large": ((*rand_qkv(N=4, D=512), {}), r"head dim q.shape\[3\] must be between 1 and 256, got 512"),
        "H not multiple of Hkv": ((*rand_qkv(H=3, Hkv=2, N=4, D=16), {}),
                                  r"q heads H=3 must be a multiple of k/v heads Hkv=2"),
        "dtype mix": ((q, k.half(), v.half(), {}), r"q, k, v must share one dtype"),
        "int dtype": ((q.int(), k, v, {}), r"q.dtype must be one of float16, bfloat16, float32, got torch.int32"),
        "float64": ((q.double(), k.double(), v.double(), {}), r"q.dtype must be one of .* got torch.float64"),
        "mask shape": ((q, k, v, {"attn_mask": torch.zeros(16, 15)}),
                       r"attn_mask shape \(16, 15\) must broadcast to \(B, H, N, N\) = \(2, 4, 16, 16\)"),
        "mask 5-d": ((q, k, v, {"attn_mask": torch.zeros(1, 1, 1, 16, 16)}), r"attn_mask shape .* must broadcast"),
        "mask dtype": ((q, k, v, {"attn_mask": torch.zeros(16, 16, dtype=torch.int64)}),
                       r"attn_mask.dtype must be bool .* got torch.int64"),
        "causal not bool": ((q, k, v, {"causal": 1}), r"causal must be a bool, got 1"),
        "scale negative": ((q, k, v, {"scale": -1.0}), r"scale must be a finite positive number or None, got -1.0"),
        "scale nan": ((q, k, v, {"scale": float("nan")}), r"scale must be a finite positive number"),
        "not a tensor": (([1.0], k, v, {}), r"q must be a torch.Tensor, got list"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
@pytest.mark.parametrize("name", CHECKED)
def test_bad_input_is_one_clear_value_error(name, case):
    (q, k, v, kw), message = _bad_cases()[case]
    with pytest.raises(ValueError, match=message):
        builds.get(name).attend(q, k, v, **kw)


@pytest.mark.parametrize("case", ["N = 0", "mask shape", "H not multiple of Hkv"])
def test_reference_checks_too(case):
    (q, k, v, kw), message = _bad_cases()[case]
    with pytest.raises(ValueError, match=message):
        reference.attend(q, k, v, **kw)


def test_device_mismatch_is_named():
    q, k, v = rand_qkv(N=4, D=16)
    meta = torch.empty_like(k, device="meta")
    with pytest.raises(ValueError, match=r"q, k, v must be on one device"):
        builds.get("fused").attend(q, meta, meta)


def test_unknown_build_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"build must be one of materialised, qk_softmax, fused, .*; got 'fast'"):
        builds.get("fast")


def test_bad_out_buffer_is_named():
    q, k, v = rand_qkv(N=8, D=16)
    with pytest.raises(ValueError, match=r"out must be a torch.float32 tensor of shape \(1, 2, 8, 16\)"):
        builds.get("fused").attend(q, k, v, out=torch.empty(1, 2, 8, 8))


def test_bad_ablation_is_named():
    q, k, v = rand_qkv(N=8, D=16)
    with pytest.raises(ValueError, match=r"ablation must be one of"):
        launch.fused(q, k, v, ablation="no_qk")
    with pytest.raises(ValueError, match=r"ablation must be None, 'no_softmax', 'no_pv' or 'zero_mask'"):
        reference.attend(q, k, v, ablation="no_qk")


def test_the_head_dim_limit_admits_256_and_refuses_257():
    assert validate.check(*rand_qkv(N=4, D=256)).D == 256
    with pytest.raises(ValueError, match=r"head dim q.shape\[3\] must be between 1 and 256, got 257"):
        validate.check(*rand_qkv(N=4, D=257))
