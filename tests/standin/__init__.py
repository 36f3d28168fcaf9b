"""Stand-ins for the GPU's measurements, installed in a papermill kernel by sitecustomize.py (this folder on
PYTHONPATH, ATTNLAB_STANDIN naming the module): the real notebooks then render their GPU path on a CPU from rows
whose values the tests know."""

import contextlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def installed(module: str, **env):
    """The environment a papermill kernel needs to start with the stand-in `module` (tests.standin.<name>) installed,
    plus `env`, set for the block and restored after it (the kernel inherits this process's environment)."""
    extra = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "standin"), str(ROOT),
                                            os.environ.get("PYTHONPATH", "")]),
             "ATTNLAB_STANDIN": module, **env}
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
