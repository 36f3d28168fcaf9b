"""Launching a Triton or Gluon kernel: Triton's own path, or the compiled kernel an identical earlier call got.

`kernel[grid](*args, **kwargs)` runs JITFunction.run on every call: it reads Triton's settings, binds and specialises
every argument, computes the cache key, finds the compiled kernel, checks the globals it read, then calls that
kernel's launcher. For a build called eagerly at a small shape this host time is most of what a caller waits for.
`run` keeps, per kernel and device, the compiled kernel Triton chose for a call, under a key finer than Triton's
specialisation: every scalar by its exact value, each tensor by its dtype and 16-byte alignment, each tensor
descriptor by its dtype, alignment, shape, strides, block, layout and padding, the keyword arguments (constexprs and
options) by their values. A later call with the same key calls that kernel's launcher directly with the arguments
in Triton's order; a call with a new key takes Triton's path, which compiles or finds its kernel, and keeps it.

Triton's path runs, whatever the key:
- in Triton's interpreter (no compiled kernel there) and for a kernel with pre-run hooks;
- while a launch hook would run (triton.knobs.runtime.launch_enter_hook or launch_exit_hook holds a function:
  proton and other profilers read launches through them). Triton's own path builds each launch's metadata and
  passes both hook chains to the launcher even while they are empty; the direct path passes None for all three;
- under ATTNLAB_LAUNCH=triton, and with a Triton release other than those in TRITON_RELEASES.
ATTNLAB_LAUNCH=verify, or the block `with verifying():`, takes the direct path and checks on each call that Triton's
own binding picks the same compiled kernel and passes the same arguments: the gate's repeated call of each build runs
so, which checks the key against Triton's at every shape the gate covers."""
from __future__ import annotations

import contextlib
import inspect
import os

import torch
import triton
from triton import knobs
from triton.runtime import driver

MODES = ("direct", "triton", "verify")
# The direct path is opt-in (ATTNLAB_LAUNCH=direct): the gate passes under it on an H100, but it buys fused 4-11 % of
# its host time, and a kernel of many scalar arguments keys slower than Triton binds (docs/performance.md)
DEFAULT = "triton"
# The Triton releases whose JITFunction internals (device_caches, CompiledKernel.run's arguments) the direct path and
# its check were written and checked against; any other takes Triton's path.
TRITON_RELEASES = ("3.6.",)
KEPT = 4096  # compiled kernels remembered before the memory is emptied (a new shape per call is not a workload)

_forced: list = []  # modes set by `verifying`, innermost last; they win over ATTNLAB_LAUNCH
_compiled: dict = {}  # key -> Triton's CompiledKernel
_orders: dict = {}  # (kernel, positional count, keyword names) -> where each parameter's value comes from


def mode() -> str:
    """'verify' inside `verifying`, else ATTNLAB_LAUNCH, checked: 'direct', 'triton' (DEFAULT) or 'verify'."""
    if _forced:
        return _forced[-1]
    m = os.environ.get("ATTNLAB_LAUNCH") or DEFAULT
    if m not in MODES:
        raise ValueError(f"ATTNLAB_LAUNCH must be one of {MODES}, got {m!r}")
    return m


@contextlib.contextmanager
def verifying():
    """Launches inside take the direct path and check it against Triton's own binding (the gate's repeated call);
    under ATTNLAB_LAUNCH=triton they stay on Triton's path."""
    _forced.append("triton" if mode() == "triton" else "verify")
    try:
        yield
    finally:
        _forced.pop()


def _feature(x):
    """What of one argument enters the key; None for an argument the key cannot describe (Triton's path then)."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if x is None or isinstance(x, (bool, int, float, str)):
        return type(x), x
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(x, "block_shape"):  # a host-side tensor descriptor
        return (type(x), base.dtype, base.data_ptr() % 16 == 0, tuple(x.shape), tuple(x.strides),
                tuple(x.block_shape), getattr(x, "layout", None), getattr(x, "padding", None))
    return None


def order(kernel, n_args: int, names: tuple) -> tuple:
    """For each of the kernel's parameters in order: ('arg', i), ('kw', name) or ('default', value), the way
    inspect.Signature.bind with apply_defaults fills it; keyword names that are no parameter are Triton's options."""
    key = (kernel, n_args, names)
    if key not in _orders:
        params = list(inspect.signature(kernel.fn).parameters.values())
        if n_args > len(params):
            raise TypeError(f"{kernel.fn.__name__} takes {len(params)} arguments, got {n_args} positional")
        _orders[key] = tuple(("arg", i) if i < n_args else ("kw", p.name) if p.name in names else
                             ("default", p.default) for i, p in enumerate(params))
    return _orders[key]


def _bound(kernel, args: tuple, kwargs: dict) -> list:
    """Every parameter's value in the kernel's order, as Triton's binder passes them to the launcher."""
    return [args[v] if how == "arg" else kwargs[v] if how == "kw" else v
            for how, v in order(kernel, len(args), tuple(kwargs))]


def _key(kernel, device: int, debug, args: tuple, kwargs: dict):
    """The call's key, or None where an argument has no feature (Triton's path then)."""
    key = [kernel, device, debug]
    for a in args:
        f = _feature(a)
        if f is None:
            return None
        key.append(f)
    for name, a in kwargs.items():
        f = _feature(a)
        if f is None:
            return None
        key.append((name, f))
    return tuple(key)


def run(kernel, grid: tuple, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, by the compiled kernel an identical earlier call got where that is safe."""
    m = mode()
    runtime = knobs.runtime
    if (m == "triton" or not triton.__version__.startswith(TRITON_RELEASES) or not hasattr(kernel, "device_caches")
            or kernel.pre_run_hooks or callable(grid)
            or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)):
        return kernel[grid](*args, **kwargs)
    device = _device()
    key = _key(kernel, device, runtime.debug, args, kwargs)
    if key is None:
        return kernel[grid](*args, **kwargs)
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        if compiled is not None:
            if len(_compiled) >= KEPT:
                _compiled.clear()
            _compiled[key] = compiled
        return compiled
    if m == "verify":
        _verify(kernel, device, compiled, args, kwargs)
    grid = (*grid, 1, 1)
    compiled.run(grid[0], grid[1], grid[2], _stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *_bound(kernel, args, kwargs))
    return compiled


def _hooked(hook) -> bool:
    """Whether a launch hook would run: Triton keeps each as a HookChain, empty unless a profiler added to it."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _device() -> int:
    """The device Triton launches on: the current one, as in JITFunction.run."""
    return driver.active.get_current_device()


def _stream(device: int):
    """The current stream's handle on `device`, as JITFunction.run passes it."""
    return driver.active.get_current_stream(device)


def _same(a, b) -> bool:
    return a is b or (not isinstance(a, torch.Tensor) and type(a) is type(b) and a == b)


def _verify(kernel, device: int, compiled, args: tuple, kwargs: dict) -> None:
    """Raise if Triton's own binding of this call picks another compiled kernel than the one the key found, or
    passes the launcher other arguments."""
    from triton.runtime.jit import compute_cache_key

    kw = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    kernel_cache, key_cache, _target, _backend, binder = kernel.device_caches[device]
    bound, specialization, options = binder(*args, **kw)
    name = kernel.fn.__name__
    if kernel_cache.get(compute_cache_key(key_cache, specialization, options)) is not compiled:
        raise AssertionError(f"attnlab.triton.dispatch: the key found another compiled kernel than Triton's for {name}")
    ours = _bound(kernel, args, kwargs)
    if len(ours) != len(bound) or not all(_same(a, b) for a, b in zip(bound.values(), ours)):
        raise AssertionError(f"attnlab.triton.dispatch: the launcher's arguments differ from Triton's for {name}")
