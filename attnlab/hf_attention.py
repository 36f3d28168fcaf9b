"""Our builds and the library rows as attention implementations of a transformers model.

    names = register()                       every build below, under "attnlab_<build>", and the copy-of-V ablation
    model.set_attn_implementation("attnlab_fused")
    model(input_ids, attention_mask=...)     each layer's attention now runs our fused kernel

transformers calls an attention implementation per layer as `f(module, query, key, value, attention_mask, scaling=,
dropout=, **kwargs) -> (output (B, N, H, D), weights or None)`, query (B, H, N, D), key and value (B, Hkv, N, D):
grouped-query attention arrives with Hkv < H heads, which our builds take as they are (no repeat_kv). Each name is
also registered with transformers' SDPA mask function, so the model hands it what it hands SDPA:

    no padding     attention_mask None and the module's is_causal: our causal flag (the kernels skip future tiles)
    padding        a boolean (B, 1, N, N) mask, True = attend, causality already in it: our attn_mask, causal off

Our builds run as the torch.library ops of attnlab.builds.ops (torch.ops.attnlab.fused, …), so a model compiled with
torch.compile traces each layer's attention without a graph break; the library rows call their functions. A row with
no key left to attend to (a left-padded position) gives zeros in our builds, as in SDPA. What a build cannot take (dropout, a softcap, a query shorter than its keys, as in decoding with a KV cache) raises Unsupported
before any kernel runs. transformers is optional (the `model` extra): `require()` names the install command.
"""
from __future__ import annotations

import importlib.util


from attnlab import builds
from attnlab.builds import Unsupported

PREFIX = "attnlab_"
INSTALL = "pip install -e '.[model]'"
# The builds registered (ours and the library rows; the kernel ablations are questions about attention alone)
REGISTERED = tuple(b.name for b in builds.BUILDS.values() if b.family in ("ours", "library"))
COPY_V = "copy_v"  # attention ablated: each query head's output is its k/v head's V, unchanged
# transformers reads an implementation name that holds "flash" as a request for the flash-attn package or a hub
# kernel (transformers.utils.generic.is_flash_attention_requested) and fails to load one, so such a build is
# registered under another name
ALIASES = {"sdpa_flash": "sdpa_fa2"}


def available() -> bool:
    """Whether transformers can be imported here."""
    return importlib.util.find_spec("transformers") is not None


def require() -> None:
    """ImportError naming the install command when transformers is absent."""
    if not available():
        raise ImportError(f"this part of the lab runs a transformers model, and transformers is not installed here: "
                          f"{INSTALL}")


def impl_name(build: str) -> str:
    """The name a build is registered under in transformers ('fused' -> 'attnlab_fused'; ALIASES: 'sdpa_flash' ->
    'attnlab_sdpa_fa2')."""
    if build not in REGISTERED and build != COPY_V:
        raise ValueError(f"build must be one of {', '.join((*REGISTERED, COPY_V))}; got {build!r}")
    return PREFIX + ALIASES.get(build, build)


def _causal_flag(module, query, attention_mask, is_causal) -> bool:
    """SDPA's rule in transformers: causal when the module is, there is more than one query, and no mask is given
    (a mask, when given, already holds the causal pattern)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(query.shape[2] > 1 and attention_mask is None and is_causal)


def _refuse(query, key, dropout, kwargs) -> None:
    if dropout:
        raise Unsupported(f"dropout {dropout} in attention: our builds apply none (a config with attention_dropout "
                          "0, or the model in eval())")
    if kwargs.get("softcap") is not None:
        raise Unsupported("a logit softcap: our builds apply none")
    if key.shape[2] != query.shape[2]:
        raise Unsupported(f"{query.shape[2]} queries against {key.shape[2]} keys (decoding with a KV cache): our "
                          "builds take q, k and v of one length")


def attention_function(build: str):
    """The transformers attention function running `build` (a name in REGISTERED): our builds by their torch op."""
    b = builds.get(build)
    if b.family == "ours":
        from attnlab.builds import ops

        op = ops.get(build)

        def run(query, key, value, causal, attention_mask, scaling):
            return op(query, key, value, attention_mask, causal, None if scaling is None else float(scaling))
    else:
        def run(query, key, value, causal, attention_mask, scaling):
            return b.attend(query, key, value, causal=causal, attn_mask=attention_mask, scale=scaling)

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None, **kwargs):
        _refuse(query, key, dropout, kwargs)
        causal = _causal_flag(module, query, attention_mask, is_causal)
        o = run(query, key, value, causal, attention_mask, scaling)  # (B, H, N, D)
        return o.transpose(1, 2).contiguous(), None  # (B, N, H, D), no attention weights

    attend.__name__ = impl_name(build)
    return attend


def copy_v(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention ablated to a copy of V: query head h outputs its k/v head's V as it is. Legal (the layer's output
    projection reads it; shapes and dtype unchanged), it reads V and writes O as every build must, and does no
    attention: a forward with it, subtracted from a forward with a build, leaves that build's attention time."""
    group = query.shape[1] // value.shape[1]
    o = value.repeat_interleave(group, dim=1) if group > 1 else value  # (B, H, N, D)
    return o.transpose(1, 2).contiguous(), None  # (B, N, H, D)


def register() -> list[str]:
    """Register every build of REGISTERED and copy_v with transformers' AttentionInterface, each with SDPA's mask
    function (module docstring); returns the registered names. Registering again replaces them (idempotent)."""
    require()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    names = []
    for build in (*REGISTERED, COPY_V):
        name = impl_name(build)
        AttentionInterface.register(name, copy_v if build == COPY_V else attention_function(build))
        AttentionMaskInterface.register(name, sdpa_mask)
        names.append(name)
    return names


def transformers_function(impl: str, module):
    """The function transformers runs for attention implementation `impl` in `module`'s model: a registered one, or
    for 'eager' the model's own eager_attention_forward (it lives in the model's modelling file)."""
    require()
    from transformers import AttentionInterface

    if impl == "eager":
        return importlib.import_module(type(module).__module__).eager_attention_forward
    return AttentionInterface()[impl]

