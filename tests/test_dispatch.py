"""attnlab.triton.dispatch: which calls reuse a compiled kernel, the launcher's arguments in Triton's order, and
every case that takes Triton's own path. A fake kernel stands in for a JITFunction (no GPU here); the key's
agreement with Triton's binder is checked on a GPU by running the gate under ATTNLAB_LAUNCH=verify."""
import inspect

import pytest
import torch
from triton import knobs

from attnlab.triton import dispatch, fused, materialised, pv, qk_softmax


def body(q, k, o, N, scale, BLOCK: "constexpr", CAUSAL: "constexpr" = False, EXTRA: "constexpr" = 7):
    pass


class Compiled:
    """A compiled kernel that records its launches."""

    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)


class FakeKernel:
    """Triton's `kernel[grid](...)`: counts its calls and returns one compiled kernel per distinct call."""

    def __init__(self):
        self.fn, self.device_caches, self.pre_run_hooks, self.debug = body, {}, [], False
        self.calls, self.compiled = 0, {}

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls += 1
            key = (grid, *(a.dtype if isinstance(a, torch.Tensor) else a for a in args), *kwargs.items())
            return self.compiled.setdefault(key, Compiled())
        return call


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(dispatch, "_device", lambda: 0)
    monkeypatch.setattr(dispatch, "_stream", lambda device: "stream")
    monkeypatch.setenv("ATTNLAB_LAUNCH", "direct")
    monkeypatch.setattr(dispatch.triton, "__version__", "3.6.0")  # a release the direct path knows
    dispatch._compiled.clear()
    return FakeKernel()


def _tensors(dtype=torch.float16):
    return [torch.zeros(64, dtype=dtype) for _ in range(3)]


def test_a_repeated_call_launches_the_compiled_kernel_with_every_argument_in_order(kernel):
    q, k, o = _tensors()
    first = dispatch.run(kernel, (4, 2), q, k, o, 128, 0.125, BLOCK=64, num_warps=4)
    again = dispatch.run(kernel, (4, 2), q, k, o, 128, 0.125, BLOCK=64, num_warps=4)
    assert kernel.calls == 1 and again is first
    # grid padded to 3 axes, the stream, the kernel's handles, no launch metadata or hooks, then each parameter in
    # order: defaults filled in, the option num_warps left to the compiled kernel
    assert first.launches == [(4, 2, 1, "stream", "fn", "meta", None, None, None, q, k, o, 128, 0.125, 64, False, 7)]


def test_any_change_the_key_describes_takes_tritons_path(kernel):
    q, k, o = _tensors()
    base = dict(BLOCK=64, num_warps=4)
    dispatch.run(kernel, (4,), q, k, o, 128, 0.125, **base)
    changed = [
        ((q, k, o, 129, 0.125), base),  # a scalar
        ((q, k, o, 128, 0.25), base),  # a float
        ((*_tensors(torch.bfloat16), 128, 0.125), base),  # a dtype
        ((torch.zeros(65, dtype=torch.float16)[1:], k, o, 128, 0.125), base),  # a tensor off 16-byte alignment
        ((q, k, o, 128, 0.125), dict(base, BLOCK=128)),  # a constexpr
        ((q, k, o, 128, 0.125), dict(base, num_warps=8)),  # an option
        ((q, k, o, 128, 0.125), dict(base, CAUSAL=True)),  # a keyword the first call left to its default
    ]
    for n, (args, kwargs) in enumerate(changed, start=2):
        dispatch.run(kernel, (4,), *args, **kwargs)
        assert kernel.calls == n, changed[n - 2]
    assert all(not c.launches for c in kernel.compiled.values())  # each new key's first call was Triton's
    dispatch.run(kernel, (4,), *changed[0][0], **changed[0][1])
    assert kernel.calls == len(changed) + 1  # ...and its second is direct


def test_a_new_grid_alone_reuses_the_kernel(kernel):
    q, k, o = _tensors()
    compiled = dispatch.run(kernel, (4,), q, k, o, 128, 0.125, BLOCK=64)
    dispatch.run(kernel, (9, 3, 2), q, k, o, 128, 0.125, BLOCK=64)
    assert kernel.calls == 1 and compiled.launches[0][:3] == (9, 3, 2)


@pytest.mark.parametrize("setting", ["env", "release", "enter_hook", "exit_hook", "hook_function", "pre_run_hook",
                                     "grid_function", "object"])
def test_tritons_path_runs_where_the_direct_one_would_hide_something(kernel, monkeypatch, setting):
    q, k, o = _tensors()
    args, grid = [q, k, o, 128, 0.125], (4,)
    if setting == "env":
        monkeypatch.setenv("ATTNLAB_LAUNCH", "triton")
    elif setting == "release":  # internals the direct path was not checked against
        monkeypatch.setattr(dispatch.triton, "__version__", "3.7.0")
    elif setting in ("enter_hook", "exit_hook"):
        chain = getattr(knobs.runtime, f"launch_{setting.split('_')[0]}_hook")
        monkeypatch.setattr(chain, "calls", [lambda *a: None])  # as proton adds itself
    elif setting == "hook_function":  # a hook set as a plain function, not added to the chain
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    elif setting == "pre_run_hook":
        kernel.pre_run_hooks = [lambda *a, **k: None]
    elif setting == "grid_function":
        grid = lambda meta: (4,)  # noqa: E731
    else:
        args[3] = object()  # an argument the key cannot describe
    for _ in range(3):
        dispatch.run(kernel, grid, *args, BLOCK=64)
    assert kernel.calls == 3 and not any(c.launches for c in kernel.compiled.values())


def test_the_interpreters_kernels_take_tritons_path(kernel):
    class Interpreted:  # no device_caches: TRITON_INTERPRET's InterpretedFunction
        fn, pre_run_hooks, calls = body, [], 0

        def __getitem__(self, grid):
            def call(*args, **kwargs):
                self.calls += 1
            return call

    interpreted = Interpreted()
    for _ in range(2):
        dispatch.run(interpreted, (1,), *_tensors(), 1, 1.0, BLOCK=16)
    assert interpreted.calls == 2


def test_a_bad_launch_mode_is_one_clear_error(kernel, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LAUNCH", "fast")
    with pytest.raises(ValueError, match=r"ATTNLAB_LAUNCH must be one of \('direct', 'triton', 'verify'\), got 'fast'"):
        dispatch.run(kernel, (1,), *_tensors(), 1, 1.0, BLOCK=16)


def test_a_full_memory_is_emptied(kernel, monkeypatch):
    monkeypatch.setattr(dispatch, "KEPT", 3)
    q, k, o = _tensors()
    for n in range(4):
        dispatch.run(kernel, (1,), q, k, o, n, 1.0, BLOCK=16)
    assert len(dispatch._compiled) == 1
    dispatch.run(kernel, (1,), q, k, o, 3, 1.0, BLOCK=16)
    assert kernel.calls == 4  # the last key is kept after the clear


@pytest.mark.parametrize("fn", [fused.fused_kernel, materialised.scores_kernel, materialised.softmax_kernel,
                                pv.pv_kernel, qk_softmax.qk_softmax_kernel], ids=lambda f: f.fn.__name__)
def test_the_order_is_pythons_binding_for_our_kernels(fn):
    params = list(inspect.signature(fn.fn).parameters)
    n = len(params) // 2
    args = tuple(f"a{i}" for i in range(n))
    sig = inspect.signature(fn.fn)
    # the keywords given in reverse order, and every other one that has a default left to it
    kwargs = {p: f"k_{p}" for i, p in enumerate(reversed(params[n:]))
              if i % 2 or sig.parameters[p].default is inspect.Parameter.empty}
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    assert dispatch._bound(fn, args, kwargs) == list(bound.arguments.values())


def test_verifying_checks_the_launches_inside_it_unless_tritons_path_is_asked_for(monkeypatch):
    monkeypatch.setenv("ATTNLAB_LAUNCH", "direct")
    with dispatch.verifying():
        assert dispatch.mode() == "verify"
    assert dispatch.mode() == "direct"
    monkeypatch.setenv("ATTNLAB_LAUNCH", "triton")
    with dispatch.verifying():
        assert dispatch.mode() == "triton"


def test_verify_mode_passes_the_kernel_triton_picks_and_names_one_it_does_not(kernel, monkeypatch):
    q, k, o = _tensors()
    compiled = dispatch.run(kernel, (4,), q, k, o, 128, 0.125, BLOCK=64)

    def binder(*args, **kwargs):  # Triton's: every parameter bound, the specialisation, the options
        sig = inspect.signature(body)
        b = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        b.apply_defaults()
        return b.arguments, "spec", "options"

    kernel.device_caches[0] = ({"key": compiled}, None, None, None, binder)
    monkeypatch.setattr("triton.runtime.jit.compute_cache_key", lambda cache, spec, options: "key")
    with dispatch.verifying():
        dispatch.run(kernel, (4,), q, k, o, 128, 0.125, BLOCK=64)
    assert len(compiled.launches) == 1
    kernel.device_caches[0][0]["key"] = Compiled()  # Triton would launch another compiled kernel
    with dispatch.verifying(), pytest.raises(AssertionError, match="another compiled kernel than Triton's for body"):
        dispatch.run(kernel, (4,), q, k, o, 128, 0.125, BLOCK=64)
    kernel.device_caches[0][0]["key"] = compiled

    def shuffled(*args, **kwargs):  # Triton would pass the launcher k where we pass q
        bound, spec, options = binder(*args, **kwargs)
        return dict(bound, q=bound["k"]), spec, options

    kernel.device_caches[0] = (*kernel.device_caches[0][:4], shuffled)
    with dispatch.verifying(), pytest.raises(AssertionError, match="launcher's arguments differ from Triton's"):
        dispatch.run(kernel, (4,), q, k, o, 128, 0.125, BLOCK=64)
