"""A transformers causal LM built from a config with random weights, and one whole forward pass measured per build.

    spec = ModelSpec("llama-1b", layers=4, hidden=2048, heads=16, kv_heads=4, head_dim=128, intermediate=8192,
                     vocab=32000)
    model = build(spec, dtype="bfloat16", device="cuda", seed=0)       # offline: no weights are downloaded
    ref = references(model, spec, B, N, seed)                          # transformers' own SDPA path's logits
    row = measure_forward(model, spec, "fused", B, N, ref=ref)         # one row of COLUMNS

Every build runs in the same model object (the same weights): only `config._attn_implementation` changes between
them (attnlab.hf_attention registers ours under "attnlab_<build>"). Each row holds

    forward     the whole forward (logits of B·N tokens, no KV cache) called eagerly from Python, back to back, as a
                user runs a model (attnlab.measure.Eager: CUDA events around each window, no graph); `windows`
                such windows, their median, p20 and p80. The first call is a figure of its own (cold_s: Triton
                compiles there). On a CPU our kernels run in Triton's interpreter: the times measure Python.
    attention   one layer's attention call alone, at the model's shape (B, H, Hkv, N, D, causal), through the same
                function transformers calls (transpose to (B, N, H, D) included), eagerly: attention_ms
    share       not measured here but read off the rows: the build 'copy_v' is the same forward with attention
                replaced by a copy of V, so forward − copy_v's forward is the attention's time inside the model
    peak        peak allocation of one forward above what was allocated before (weights excluded); NaN on a CPU
    logits      the largest |Δ| and ‖Δ‖/‖ref‖ of the logits against transformers' SDPA path at the same input, and
                the largest |Δ| over real tokens with the last sequence left-padded by a quarter (padded_maxdiff):
                the padding mask reaches the build as transformers builds it

Inputs are random token ids seeded by (seed, B, N), never by the build, so every build of a shape reads the same.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from attnlab import builds, hf_attention, measure, provenance
from attnlab.validate import MAX_HEAD_DIM

TRANSFORMERS = {"transformers_sdpa": "sdpa", "transformers_eager": "eager"}  # transformers' own paths: build -> impl
REFERENCE = "transformers_sdpa"  # the logits every row is compared with
ABLATED = hf_attention.COPY_V  # attention replaced by a copy of V: the forward without attention's work

COLUMNS = {
    "run_id": "the run (output folder name) the row belongs to",
    "case_id": "model|B|N|dtype|build: the row's key within a run (a resumed run measures only missing keys)",
    "model": "the model config's name in the params file",
    "model_type": "transformers' model type (e.g. 'llama')",
    "layers": "decoder layers: attention runs once per layer per forward",
    "hidden": "hidden size", "intermediate": "MLP intermediate size", "vocab": "vocabulary size",
    "params": "parameters of the model (embedding and output head included)",
    "H": "query heads", "Hkv": "key/value heads (< H: grouped-query attention)", "D": "head dim",
    "B": "batch (sequences)", "N": "sequence length (tokens per sequence)",
    "dtype": "the model's dtype",
    "build": "the attention: 'transformers_sdpa' or 'transformers_eager' (transformers' own), one of attnlab's builds "
             "(ours or a library row), or 'copy_v' (attention replaced by a copy of V)",
    "mode": "'eager' (the model called from Python as it is) or the torch.compile mode the whole forward ran under "
            "('reduce-overhead': compiled by inductor, replayed as CUDA graphs): as deployed",
    "graph_breaks": "graph breaks torch.compile reported compiling the forward (NaN for eager rows): 0 means one "
                    "graph, our attention traced as one op",
    "family": "'transformers', 'ours', 'library' or 'ablation' (copy_v)",
    "impl": "the attention implementation's name in transformers (e.g. 'attnlab_fused', 'sdpa')",
    "device": "e.g. 'cuda:0' or 'cpu'", "device_name": "e.g. 'NVIDIA H200' or the CPU model",
    "status": "'ok', 'unsupported: <why>', 'oom: ...' or 'error: <type>: <message>'",
    "cold_s": "wall seconds of the row's first forward (our kernels compile there at a model's first shape; "
              "transformers_sdpa has run twice before it, for the references), never in forward_ms",
    "forward_ms": "one forward pass, called eagerly back to back: the median over `windows` windows of the mean per "
                  "call (on a CPU, in Triton's interpreter: Python's time)",
    "forward_p20": "20th percentile of the windows", "forward_p80": "80th percentile of the windows",
    "reps": "forward calls timed, all windows together",
    "timer": "the timer (attnlab.measure.eager_ms's name for it)",
    "attention_ms": "one layer's attention called alone at the model's shape, eagerly, per call (the function "
                    "transformers calls, its transpose included)",
    "attention_reps": "attention calls behind attention_ms",
    "peak_bytes": "peak allocation of one forward above what was allocated before it (weights excluded)",
    "peak_note": "why peak_bytes is NaN",
    "logits_maxdiff": "largest |logits − logits of transformers_sdpa| at the same input (NaN on the reference row)",
    "logits_rel": "‖logits − reference‖ / ‖reference‖ (Frobenius, float32)",
    "padded_maxdiff": "largest |Δ| over real tokens when the last sequence is left-padded by a quarter, against "
                      "transformers_sdpa under the same padding",
    "err_note": "what the logits columns are not: the reference itself, a padded run refused or failed",
    "started": "ISO time the row began",
    "code": "fingerprint of the attnlab sources that measured the row (provenance.code_hash)",
}
TYPES = {
    **{c: "str" for c in ("run_id", "case_id", "model", "model_type", "dtype", "build", "mode", "family", "impl", "device",
                          "device_name", "status", "timer", "peak_note", "err_note", "started", "code")},
    **{c: "int" for c in ("layers", "hidden", "intermediate", "vocab", "params", "H", "Hkv", "D", "B", "N", "reps",
                          "attention_reps")},
    **{c: "float" for c in ("graph_breaks", "cold_s", "forward_ms", "forward_p20", "forward_p80", "attention_ms", "peak_bytes",
                            "logits_maxdiff", "logits_rel", "padded_maxdiff")},
}
assert set(TYPES) == set(COLUMNS), set(TYPES) ^ set(COLUMNS)
SPEC_KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")


@dataclass(frozen=True)
class ModelSpec:
    """A causal LM's shape; the config fields every Llama-family config names the same way."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    model_type: str = "llama"

    def __post_init__(self):
        for key in SPEC_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: {key} must be a whole number >= 1, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        if self.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"model {self.name!r}: head_dim must be <= {MAX_HEAD_DIM}, got {self.head_dim}")

    def config(self):
        """The transformers config: random init, no cache, positions for the longest sequence it is asked for."""
        hf_attention.require()
        from transformers import AutoConfig

        return AutoConfig.for_model(
            self.model_type, num_hidden_layers=self.layers, hidden_size=self.hidden, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, head_dim=self.head_dim, intermediate_size=self.intermediate,
            vocab_size=self.vocab, max_position_embeddings=1 << 17, use_cache=False, tie_word_embeddings=False)


def build(spec: ModelSpec, *, dtype: str = "float32", device: str = "cpu", seed: int = 0):
    """The model of `spec` with random weights drawn from `seed`, made on `device` in `dtype`, in eval mode, and our
    builds registered (attnlab.hf_attention.register). Nothing is downloaded."""
    hf_attention.require()
    from transformers import AutoModelForCausalLM

    hf_attention.register()
    torch.manual_seed(seed)
    # made in its dtype as from_pretrained(dtype=...) makes it: the rotary frequencies stay float32 (a cast after the
    # fact would round them to the weights' dtype)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(spec.config(), dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model


def attention_module(model) -> torch.nn.Module:
    """The first layer's attention module (it carries num_key_value_groups, scaling and is_causal)."""
    for m in model.modules():
        if hasattr(m, "num_key_value_groups") and hasattr(m, "scaling"):
            return m
    raise ValueError(f"{type(model).__name__} has no attention module with num_key_value_groups and scaling")


def token_ids(spec: ModelSpec, B: int, N: int, seed: int, device) -> torch.Tensor:
    """Random token ids (B, N) from a generator seeded by (seed, B, N) only."""
    g = torch.Generator(device="cpu").manual_seed(zlib.crc32(f"{seed}|{B}|{N}".encode()))
    return torch.randint(0, spec.vocab, (B, N), generator=g).to(device)


def padding_mask(B: int, N: int, device) -> torch.Tensor:
    """transformers' 2-D attention mask (B, N), 1 = a real token: the last sequence left-padded by a quarter of N (at
    least one token where N > 1), as a batch of prompts of unequal length is padded for generation."""
    mask = torch.ones(B, N, dtype=torch.long, device=device)
    mask[-1, : max(1, N // 4) if N > 1 else 0] = 0
    return mask


def impl_of(build_name: str) -> str:
    """The attention implementation's name in transformers for a row's build."""
    return TRANSFORMERS.get(build_name) or hf_attention.impl_name(build_name)


def family_of(build_name: str) -> str:
    if build_name in TRANSFORMERS:
        return "transformers"
    if build_name == ABLATED:
        return "ablation"
    return builds.get(build_name).family


def use(model, build_name: str) -> None:
    """Make `build_name` the model's attention (once: a user sets it once, not per forward)."""
    model.set_attn_implementation(impl_of(build_name))


def run_model(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The logits (B, N, vocab) of one forward with the attention the model has now, no KV cache."""
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def forward(model, build_name: str, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The logits (B, N, vocab) of one forward with `build_name`'s attention."""
    use(model, build_name)
    return run_model(model, ids, mask)


@dataclass
class References:
    """transformers' SDPA path's logits at one shape: plain, and with padding_mask (and the mask)."""

    logits: torch.Tensor
    padded: torch.Tensor
    mask: torch.Tensor


def references(model, spec: ModelSpec, B: int, N: int, seed: int = 0) -> References:
    dev = next(model.parameters()).device
    ids = token_ids(spec, B, N, seed, dev)
    mask = padding_mask(B, N, dev)
    return References(forward(model, REFERENCE, ids), forward(model, REFERENCE, ids, mask), mask)


def differences(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(largest |Δ|, ‖Δ‖/‖ref‖) in float32."""
    d = out.float() - ref.float()
    return float(d.abs().max()), float(d.norm() / ref.float().norm())


EAGER = "eager"  # a row's mode when the model runs as it is; any other mode is torch.compile's
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def case_id(spec: ModelSpec, B: int, N: int, dtype: str, build_name: str, mode: str = EAGER) -> str:
    """model|B|N|dtype|build, and |mode for a compiled row (an eager row's id is the same as before modes existed)."""
    return "|".join(str(x) for x in (spec.name, B, N, dtype, build_name, *(() if mode == EAGER else (mode,))))


def blank_row() -> dict:
    """Every column empty (NaN, 0 or ""), and the mode eager."""
    empty = {"str": "", "float": math.nan, "int": 0}
    return {**{c: empty[TYPES[c]] for c in COLUMNS}, "mode": EAGER}


def base_row(model, spec: ModelSpec, build_name: str, B: int, N: int, run_id: str = "", mode: str = EAGER) -> dict:
    """The row's identity: everything known before the build runs."""
    p = next(model.parameters())
    dtype = str(p.dtype).removeprefix("torch.")
    row = blank_row()
    row.update(run_id=run_id, case_id=case_id(spec, B, N, dtype, build_name, mode), model=spec.name, mode=mode,
               model_type=spec.model_type, layers=spec.layers, hidden=spec.hidden, intermediate=spec.intermediate,
               vocab=spec.vocab, params=sum(t.numel() for t in model.parameters()), H=spec.heads, Hkv=spec.kv_heads,
               D=spec.head_dim, B=B, N=N, dtype=dtype, build=build_name, family=family_of(build_name),
               impl=impl_of(build_name), device=str(p.device), device_name=provenance.device_name(str(p.device)),
               started=provenance.now(), code=provenance.code_hash())
    return row


def attention_alone(model, spec: ModelSpec, build_name: str, B: int, N: int, seed: int = 0, **timing
                    ) -> tuple[float, int]:
    """(ms per call, calls) of one layer's attention alone at the model's shape, causal, eagerly (attnlab.measure's
    pipeline with its Eager timer, no peak pass): the function transformers calls for this build, with the first
    layer's module, on random q (B, H, N, D), k, v (B, Hkv, N, D). Raises what the call raises."""
    module = attention_module(model)
    p = next(model.parameters())

    def prepare() -> measure.Plan:
        case = measure.Case("fused", B, spec.heads, spec.kv_heads, N, spec.head_dim, p.dtype, True, str(p.device))
        q, k, v = measure.make_inputs(case, seed)  # inputs depend on the shape only, never on the build
        fn = hf_attention.transformers_function(impl_of(build_name), module)
        return measure.Plan(lambda: fn(module, q, k, v, None, scaling=module.scaling, dropout=0.0))

    got = measure.pipeline(prepare, p.device, measure.Eager(**timing), peak=False)
    if got.error is not None:
        raise got.error
    return got.fields["ms"], got.fields["reps"]


def failure(e: BaseException) -> str:
    """A row's status for a call that raised: unsupported, out of memory (with the failed allocation's size where
    the allocator names it), or the error in one line."""
    if isinstance(e, hf_attention.Unsupported):
        return measure.one_line(f"unsupported: {e}")
    if measure.is_oom(e):
        status = measure.oom_status(e, 0)
        return status if "failed allocation" in status else "oom: the allocator named no size"
    return measure.one_line(f"error: {type(e).__name__}: {e}")


def check_logits(model, build_name: str, ids: torch.Tensor, logits: torch.Tensor, ref: References) -> dict:
    """logits_maxdiff and logits_rel of the first forward's logits against transformers' SDPA path, padded_maxdiff
    of a forward with ref's padding mask over the real tokens, and err_note (the reference itself; a padded run
    refused or failed: the unpadded figures stand)."""
    if build_name == REFERENCE:
        return dict(err_note="the reference: every other row's logits are compared with this build's")
    out, notes = {}, []
    out["logits_maxdiff"], out["logits_rel"] = differences(logits, ref.logits)
    try:
        padded = run_model(model, ids, ref.mask)
        real = ref.mask.bool()
        out["padded_maxdiff"] = differences(padded[real], ref.padded[real])[0]
    except hf_attention.Unsupported as e:
        notes.append(measure.one_line(f"padded run unsupported: {e}"))
    except Exception as e:
        notes.append(f"padded run failed: {failure(e)}")
    return {**out, "err_note": "; ".join(notes)}


RENAMED = {"ms": "forward_ms", "ms_p20": "forward_p20", "ms_p80": "forward_p80"}  # the Eager timer's -> a row's


def compiled(model, mode: str):
    """The model's forward compiled by torch.compile in `mode`, as a user deploys it, and a count of the graph breaks
    it reports: (call(ids) -> logits, breaks() -> int). Dynamo's caches are reset first, so each build compiles its
    own graph (the attention implementation is read while tracing)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(model, mode=mode)

    def call(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # not inference_mode: CUDA-graph trees record under no_grad
            return fn(input_ids=ids, use_cache=False).logits

    return call, lambda: sum(counters["graph_break"].values())


def measure_forward(model, spec: ModelSpec, build_name: str, B: int, N: int, *, ref: References, seed: int = 0,
                    windows: int = 3, reps_ms: float = 100.0, min_reps: int = 3, run_id: str = "",
                    mode: str = EAGER) -> dict:
    """One row of COLUMNS: `build_name`'s whole forward at (B, N) in `model` (module docstring): attnlab.measure's
    pipeline with its Eager timer over `windows` windows, the logits checked (check_logits), then one layer's
    attention alone (attention_alone). Under a compile `mode` the forward is the compiled model's (compiled),
    its first call compiles (cold_s) and its graph breaks are counted; attention alone is the eager row's and is not
    measured again. A build that cannot run is a status, never an exception."""
    row = base_row(model, spec, build_name, B, N, run_id, mode)
    dev = next(model.parameters()).device
    ids = token_ids(spec, B, N, seed, dev)
    breaks = None

    def prepare() -> measure.Plan:
        nonlocal breaks
        use(model, build_name)
        def check(logits):
            return check_logits(model, build_name, ids, logits, ref)

        if mode != EAGER:
            call, breaks = compiled(model, mode)
            return measure.Plan(lambda: call(ids), check=check)
        return measure.Plan(lambda: run_model(model, ids), check=check,
                            after=lambda out, fields: dict(zip(("attention_ms", "attention_reps"), attention_alone(
                                model, spec, build_name, B, N, seed, reps_ms=reps_ms, min_reps=min_reps))))

    got = measure.pipeline(prepare, dev, measure.Eager(windows, reps_ms=reps_ms, min_reps=min_reps))
    row.update({RENAMED.get(k, k): v for k, v in got.fields.items() if RENAMED.get(k, k) in row})
    if breaks is not None:
        row["graph_breaks"] = float(breaks())
    row["status"] = "ok" if got.error is None else failure(got.error)
    return row
