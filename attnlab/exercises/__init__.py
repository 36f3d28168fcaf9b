"""Exercises the lab checks (notebooks/exercises.ipynb): write the pieces of a fused attention yourself, and catch a
benchmark that lies. Each exercise has a check here that answers in seconds on a CPU, saying where an answer first
differs from what the lab expects.

    checks      Checks: one method per exercise, each returning a Verdict
    verdict     Verdict, and where a tensor or a list first differs from the expected one
    frame       the Triton kernel around exercise 3's piece, run in Triton's interpreter
    planted     the results table with three planted lies, and the lab's guards that find them
    solutions   reference solutions, written without the yardsticks the checks compare against
"""
from __future__ import annotations


from attnlab import environment
from attnlab.exercises.checks import Checks, key_tiles
from attnlab.exercises.planted import LIES
from attnlab.exercises.planted import table as planted_table

__all__ = ["Checks", "LIES", "key_tiles", "planted_table", "setup"]


def setup() -> dict:
    """Triton's interpreter for this process (exercise 3's piece runs in it on CPU tensors, on any machine; a
    @triton.jit function is bound to the interpreter when it is decorated, so this runs first), and wide tables."""
    import pandas as pd

    environment.use_interpreter()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    return {"TRITON_INTERPRET": "1" if environment.interpreting() else "0"}
