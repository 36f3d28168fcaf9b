"""One launch of a Triton or Gluon kernel as its plan says, cheap enough for a user's eager calls:

    direct.run(kernel, plan, *args, **runtime)     what kernel[plan.grid](*args, **runtime, **plan.constexprs,
                                                   **plan.options) launches, on the same compiled kernel

Triton's `kernel[grid](...)` binds and specialises every argument again at each call (JITFunction.run: the argument
binder, the specialisation of each argument, the compile-cache key), which costs the host about three times what
the compiled kernel's own launcher does (docs/performance.md, "Our builds as a user calls them", has the figures).
So the first call of each (kernel, plan, argument signature) goes through `kernel[grid]`, which compiles or finds the
compiled kernel and launches it, and is kept; later calls with the same signature call that compiled kernel's
launcher directly.

The signature holds everything Triton specialises on, and more: each integer's value, each tensor's dtype and
whether its address is 16-byte aligned, each tensor descriptor's block, shape, strides and base, the device. A call
that differs in any of them takes `kernel[grid]` again. Where a launch hook is set (a profiler's,
triton.knobs.runtime.launch_enter_hook) or the kernel runs in Triton's interpreter, every call takes `kernel[grid]`.
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime import driver

KEPT_MAX = 4096  # signatures kept; past it the cache starts over (a sweep of many shapes), never grows without bound

_kept: dict = {}
_PLAIN = frozenset((int, float, bool, type(None)))


def _signature(a):
    """What of one argument Triton may specialise on, and more: a number's value (Triton reads an integer's
    divisibility by 16 and whether it is 1, a float's type), a tensor's dtype and 16-byte alignment, a tensor
    descriptor's base, shape, strides, block and layout."""
    if type(a) in _PLAIN:
        return a
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    base = getattr(a, "base", None)  # a host tensor descriptor
    if isinstance(base, torch.Tensor):
        return (base.dtype, base.data_ptr() % 16 == 0, *a.shape, *a.strides, *a.block_shape, getattr(a, "layout", None),
                getattr(a, "padding", None))
    raise TypeError(f"direct.run: an argument of type {type(a).__name__} has no launch signature here")


def device() -> int:
    """The current CUDA device's index, as Triton's driver sees it."""
    return driver.active.get_current_device()


def stream(index: int) -> int:
    """The current stream of device `index`, as Triton's driver sees it (torch's current stream)."""
    return driver.active.get_current_stream(index)


def _hooked() -> bool:
    """Whether a launch hook is set (Triton keeps them as chains, empty unless a profiler such as proton adds one)."""
    return any(h is not None and getattr(h, "calls", True)
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def _tail(kernel, n_args: int, runtime: dict, plan) -> tuple:
    """The parameters after the positional arguments, in the kernel's order, as JITFunction.run hands them to the
    launcher: (name, True) for a runtime keyword, read at each call; (value, False) for a plan's constexpr or option,
    or the parameter's default, fixed for the plan."""
    fixed = {**plan.constexprs, **plan.options}
    return tuple((p.name, True) if p.name in runtime else (fixed[p.name] if p.name in fixed else p.default, False)
                 for p in kernel.params[n_args:])


def run(kernel, plan, *args, **runtime) -> None:
    """kernel[plan.grid](*args, **runtime, **plan.constexprs, **plan.options), through the compiled kernel's own
    launcher once this signature has been launched before. `runtime`: keyword arguments that are not constexprs
    (tensors, integers), part of the signature."""
    grid = plan.grid
    if getattr(kernel, "device_caches", None) is None or _hooked():  # the interpreter, or a profiler's hook
        kernel[grid](*args, **runtime, **plan.constexprs, **plan.options)
        return
    index = device()
    key = (id(kernel), id(plan), index, tuple(map(_signature, args)),
           tuple((k, _signature(v)) for k, v in runtime.items()))
    kept = _kept.get(key)
    if kept is None:
        compiled = kernel[grid](*args, **runtime, **plan.constexprs, **plan.options)
        if hasattr(compiled, "result"):  # compiled asynchronously
            compiled = compiled.result()
        if len(_kept) >= KEPT_MAX:
            _kept.clear()
        # the kernel and plan are kept with it: their ids in the key cannot be reused while the entry lives
        _kept[key] = (kernel, plan, compiled, tuple(grid) + (1,) * (3 - len(grid)),
                      _tail(kernel, len(args), runtime, plan))
        return
    _, _, compiled, (g0, g1, g2), tail = kept
    rest = [runtime[v] if from_call else v for v, from_call in tail]
    compiled.run(g0, g1, g2, stream(index), compiled.function, compiled.packed_metadata, None, None, None, *args,
                 *rest)


def forget() -> None:
    """Drop every kept signature (the next call of each takes kernel[grid] again)."""
    _kept.clear()
