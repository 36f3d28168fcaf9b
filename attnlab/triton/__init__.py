"""Our three Triton builds of one attention forward pass, each a step further along the fusion path.

    materialised  QKᵀ kernel writes S  →  softmax kernel reads S, writes P  →  PV kernel reads P, writes O
    qk_softmax    one kernel: QKᵀ, scale, mask, softmax; writes only P     →  the same PV kernel
    fused         one flash-style kernel (online softmax, arXiv:2205.14135, 2307.08691); writes only O

Adjacent builds share their tile code (tiles.score_tile, and one PV kernel: pv.pv_kernel, or pv_gluon's on Hopper
where its table entry takes the case) so that the difference between them is the one boundary removed. Ablations are
constexpr flags on the same kernels (NO_SOFTMAX, NO_PV), never copied kernels.

Without a GPU the kernels run in Triton's interpreter on CPU tensors. The interpreter is chosen when a @triton.jit
function is *defined*, so it must be switched on before the kernel modules are imported: that happens here.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One Triton cache for the whole process. torch.compile's Triton autotuner (torch._inductor, which compiled
# FlexAttention runs through) sets TRITON_CACHE_DIR process-wide to a directory of its own the first time it compiles,
# when the variable is unset; every kernel of ours compiled after that in the same process then misses what Triton's
# own cache holds (what `python -m attnlab.warm` or an earlier run compiled) and compiles again: 2-9 s a kernel in a
# GPU sweep after the warm step. Naming Triton's own default directory first keeps both in it.
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~/"),
                                                       ".triton", "cache"))
