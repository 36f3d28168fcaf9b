"""Our three Triton builds of one attention forward pass, each a step further along the fusion path.

    materialised  QKᵀ kernel writes S  →  softmax kernel reads S, writes P  →  PV kernel reads P, writes O
    qk_softmax    one kernel: QKᵀ, scale, mask, softmax; writes only P     →  the same PV kernel
    fused         one flash-style kernel (online softmax, arXiv:2205.14135, 2307.08691); writes only O

Adjacent builds share their tile code (tiles.score_tile, and one PV kernel: pv.pv_kernel, or pv_gluon's on Hopper
where its plan takes the case: attnlab.triton.plan) so that the difference between them is the one boundary removed.
Ablations are constexpr flags on the same kernels (NO_SOFTMAX, NO_PV), never copied kernels.

Without a GPU the kernels run in Triton's interpreter on CPU tensors. The interpreter is chosen when a @triton.jit
function is *defined*, so it must be switched on before the kernel modules are imported: attnlab.environment does it
here.
"""
from attnlab import environment

environment.configure()
