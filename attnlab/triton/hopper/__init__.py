"""Our Hopper (sm90) kernels, written in Gluon, Triton's lower-level dialect: warp-specialised, TMA-fed versions of the
teaching kernels one directory up, flag for flag the same arithmetic. The plans' rules (attnlab.triton.plan) pick
them on an H100/H200 at D = 64 and 128 in fp16/bf16, under the Triton release they were checked on; everywhere else
the teaching kernels run. docs/hopper.md describes their design and the tile labels.

    common.py          what they share: work-item order, the score tile and its masks, budgets, TMA descriptors
    fused.py           the fused build: a loader warp, two consumer warpgroups in FlashAttention-3's order
    qk_softmax.py      qk_softmax's P kernel: two passes over K, P stored by TMA
    qk_softmax_row.py  qk_softmax's P kernel for N <= ROW_MAX: one pass, the row on chip
    pv.py              the PV kernel materialised and qk_softmax share, as O^T = V^T P^T
"""
