"""attnlab.triton.direct: the first call of a signature goes through kernel[grid], later ones through the compiled
kernel's launcher with every parameter in the kernel's order; anything Triton specialises on that changes, a launch
hook, or the interpreter sends the call through kernel[grid] again. A stand-in kernel records what it is asked (the
real launch is checked on the GPU by the gate, whose judged call is a repeated one)."""
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType

import pytest
import torch
from triton import knobs

from attnlab.triton import direct


@dataclass
class Param:
    name: str
    default: object = inspect.Parameter.empty


class Compiled:
    function, packed_metadata = "function", "packed"

    def __init__(self, log):
        self.log = log

    def run(self, *a):
        self.log.append(("direct", a))


class Kernel:
    """What direct.run reads of a JITFunction: device_caches, params, kernel[grid](...) returning the compiled kernel."""

    device_caches = {}

    def __init__(self):
        self.params = [Param("x"), Param("n"), Param("scale"), Param("FLAGS", None), Param("BLOCK"),
                       Param("EVEN", True)]
        self.log = []
        self.compiled = Compiled(self.log)

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("jit", grid, args, kw))
            return self.compiled
        return launch


@dataclass(frozen=True)
class Plan:
    grid: tuple = (4, 2)
    constexprs: MappingProxyType = field(default_factory=lambda: MappingProxyType({"BLOCK": 64}))
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({"num_warps": 4}))


@pytest.fixture
def kernel(monkeypatch):
    direct.forget()
    monkeypatch.setattr(direct, "device", lambda: 0)
    monkeypatch.setattr(direct, "stream", lambda index: 1234)
    yield Kernel()
    direct.forget()


def kinds(k):
    return [entry[0] for entry in k.log]


def test_a_repeated_signature_calls_the_compiled_launcher_with_every_parameter_in_order(kernel):
    plan, x = Plan(), torch.zeros(64)
    direct.run(kernel, plan, x, 1024, 0.5)
    assert kernel.log[0] == ("jit", (4, 2), (x, 1024, 0.5), {"BLOCK": 64, "num_warps": 4})
    direct.run(kernel, plan, x, 1024, 0.5)
    assert kinds(kernel) == ["jit", "direct"]
    grid_and_handles = (4, 2, 1, 1234, "function", "packed", None, None, None)
    assert kernel.log[1][1] == (*grid_and_handles, x, 1024, 0.5, None, 64, True)  # FLAGS and EVEN: their defaults


@pytest.mark.parametrize("change", ["an integer", "alignment", "dtype", "the plan"])
def test_what_triton_specialises_on_changed_takes_kernel_grid_again(kernel, change):
    plan, x = Plan(), torch.zeros(64, dtype=torch.bfloat16)
    direct.run(kernel, plan, x, 1024, 0.5)
    direct.run(kernel, plan, x, 1024, 0.5)
    other = {"an integer": (plan, x, 1025), "alignment": (plan, x[1:], 1024), "dtype": (plan, x.float(), 1024),
             "the plan": (Plan(grid=(8, 2)), x, 1024)}[change]
    direct.run(kernel, other[0], other[1], other[2], 0.5)
    assert kinds(kernel) == ["jit", "direct", "jit"]
    assert kernel.log[2][1] == other[0].grid


def test_a_runtime_keyword_is_part_of_the_signature_and_read_at_each_call(kernel):
    plan, x = Plan(), torch.zeros(64)
    flags = [torch.zeros(8, dtype=torch.int8) for _ in range(2)]
    direct.run(kernel, plan, x, 1024, 0.5, FLAGS=flags[0])
    direct.run(kernel, plan, x, 1024, 0.5, FLAGS=flags[1])
    assert kinds(kernel) == ["jit", "direct"]
    assert kernel.log[1][1][-3] is flags[1]
    direct.run(kernel, plan, x, 1024, 0.5)  # without it: another signature
    assert kinds(kernel) == ["jit", "direct", "jit"]


def test_a_launch_hook_or_the_interpreter_takes_kernel_grid_every_call(kernel, monkeypatch):
    plan, x = Plan(), torch.zeros(64)
    def hook(metadata):
        pass

    knobs.runtime.launch_enter_hook.add(hook)  # as a profiler adds its own
    try:
        for _ in range(2):
            direct.run(kernel, plan, x, 1024, 0.5)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert kinds(kernel) == ["jit", "jit"]
    monkeypatch.setattr(Kernel, "device_caches", None)  # as Triton's InterpretedFunction has none
    for _ in range(2):
        direct.run(kernel, plan, x, 1024, 0.5)
    assert kinds(kernel) == ["jit"] * 4


def test_an_argument_with_no_launch_signature_is_refused(kernel):
    with pytest.raises(TypeError, match="argument of type object"):
        direct.run(kernel, Plan(), object(), 1024, 0.5)


@dataclass
class Descriptor:
    """What direct.run reads of a host tensor descriptor (Gluon's TensorDescriptor carries these)."""

    base: torch.Tensor
    shape: list
    strides: list
    block_shape: list
    layout: str = "nvmma-128B"
    padding: str = "zero"


def test_a_descriptor_signs_with_its_base_shape_strides_block_and_layout(kernel):
    plan, x = Plan(), torch.zeros(4, 64, dtype=torch.bfloat16)
    same = [Descriptor(x, [4, 64], [64, 1], [2, 64]) for _ in range(2)]
    for d in same:
        direct.run(kernel, plan, d, 1024, 0.5)
    assert kinds(kernel) == ["jit", "direct"]
    for other in (Descriptor(x, [4, 64], [64, 1], [4, 64]), Descriptor(x, [4, 64], [64, 1], [2, 64], layout="other"),
                  Descriptor(x[:, 1:], [4, 63], [64, 1], [2, 64])):  # another block, layout, base alignment
        direct.run(kernel, plan, other, 1024, 0.5)
    assert kinds(kernel) == ["jit", "direct", "jit", "jit", "jit"]
