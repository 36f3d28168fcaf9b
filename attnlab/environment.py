"""The process's environment variables, read and written in this module alone: whether kernels run in Triton's CPU
interpreter (TRITON_INTERPRET), where compiled kernels are kept (TRITON_CACHE_DIR), and attnlab's own settings
(ATTNLAB_*). The rest of attnlab asks here, or is passed what they decide.

    configure()        at the import of attnlab.triton, before any kernel is defined (Triton binds a @triton.jit
                       function to the interpreter when it is decorated): the interpreter where no GPU is present,
                       unless the caller set TRITON_INTERPRET; Triton's own cache directory, unless set
    use_interpreter()  a command or notebook that runs on the CPU by choice (`attnlab check --device cpu`, the
                       exercises), before the kernels are defined
    interpreted()      a block whose @triton.jit functions bind to the interpreter whatever the process's setting
    interpreting()     whether kernels defined now run in the interpreter
    setting(name)      an ATTNLAB_* variable's value, or None where it is unset or empty
    child(**names)     the environment for a child process: this one's, with `names` set

The cache directory is named because torch.compile's Triton autotuner (torch._inductor, which compiled FlexAttention
runs through) sets TRITON_CACHE_DIR process-wide to a directory of its own the first time it compiles, when the
variable is unset; every kernel of ours compiled after that in the same process then misses what Triton's own cache
holds (what `python -m attnlab.warm` or an earlier run compiled) and compiles again: 2-9 s a kernel in a GPU sweep
after the warm step. Naming Triton's own default directory first keeps both in it.
"""
from __future__ import annotations

import contextlib
import os

INTERPRET = "TRITON_INTERPRET"
CACHE_DIR = "TRITON_CACHE_DIR"


def configure() -> None:
    """The interpreter where no GPU is present (a TRITON_INTERPRET the caller set stays), and Triton's default cache
    directory named (one the caller set stays)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault(INTERPRET, "1")
    os.environ.setdefault(CACHE_DIR, os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~/"),
                                                  ".triton", "cache"))


def use_interpreter() -> None:
    """Triton's interpreter for this process: kernels defined from now on run on CPU tensors."""
    os.environ[INTERPRET] = "1"


@contextlib.contextmanager
def interpreted():
    """TRITON_INTERPRET=1 for the block, as it was after: functions decorated inside run in the interpreter."""
    saved = os.environ.get(INTERPRET)
    os.environ[INTERPRET] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(INTERPRET, None)
        else:
            os.environ[INTERPRET] = saved


def interpreting() -> bool:
    """Whether Triton runs kernels defined now in its CPU interpreter (TRITON_INTERPRET set, and not "0")."""
    return os.environ.get(INTERPRET, "0") not in ("", "0")


def setting(name: str) -> str | None:
    """The value of attnlab's own environment variable `name` (ATTNLAB_*), or None where it is unset or empty."""
    if not name.startswith("ATTNLAB_"):
        raise ValueError(f"name must be one of attnlab's own variables (ATTNLAB_*), got {name!r}")
    return os.environ.get(name) or None


def child(**names: str) -> dict:
    """The environment a child process starts with: this process's, with each of `names` set to its value."""
    return {**os.environ, **names}
