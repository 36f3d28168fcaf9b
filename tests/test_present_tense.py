"""The package's comments and docstrings say what the code does and why, in the present tense: none names the session,
run, call or kernel version that found something, the retired PERFORMANCE.md, the GUIDE.md that is not in the
repository, or an issue number. Measurements of record live in docs/performance.md, and what chose each tile entry in
docs/hopper.md.

Comments are read with tokenize and docstrings with ast, so code, identifiers and the strings code prints are not
searched: a variable `v`, `q, k, v` or "run 1 of 3" in prose never match.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent / "attnlab"

# One alternative for each kind of history a comment can carry.
HISTORY = re.compile("|".join([
    r"\b[Ss]essions? [0-9]+",                      # session 12, Session 5, sessions 8 and 10
    r"\bs[0-9]{1,3}-call[0-9]+|-call[0-9]+\b",      # an old run folder: 2026-11-29-s9-call3, `-call2`
    r"\b[Cc]alls? [0-9]+\b",                       # call 3, calls 1 and 2 (of a session)
    r"\b[Rr]un [0-9]+\b(?! of\b)",                 # run 11 (but not "run 1 of 3")
    r"(?<![\w.])v[0-9]{1,2}[a-z]?\b(?!\s*=|[\[(])",  # a kernel version: v42, v32b, v9–v10 (not v1 = …, v2[i], v3(…))
    r"\bPERFORMANCE\b",                            # PERFORMANCE.md, the log docs/performance.md replaces
    r"\bGUIDE\b",                                  # GUIDE.md, not in the repository
    r"\b[Ii]ssues? #?[0-9]+",                      # issue 5's target
    r"\bNext [0-9]+\b",                            # a log's "Next 3" list
]))


def prose(source: str):
    """(line, text) of every comment and docstring in a module's source: one per comment, one per docstring line."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for i, line in enumerate(first.value.value.split("\n")):
                    yield first.lineno + i, line


def history(source: str) -> list[tuple[int, str]]:
    """(line, what matched) for each mention of a session, run, call, kernel version, PERFORMANCE.md, GUIDE.md or
    issue number in the source's comments and docstrings, in line order."""
    return sorted((line, m.group(0)) for line, text in prose(source) for m in HISTORY.finditer(text))


FILES = sorted(p for p in ROOT.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_package_speaks_in_the_present_tense():
    found = [f"attnlab/{rel(p)}:{line}: {hit!r}" for p in FILES for line, hit in history(p.read_text())]
    assert found == [], ("say what the code does and why, not which session, run or version found it (the figures "
                         "that chose a tile entry: docs/hopper.md):\n" + "\n".join(found))


MADE_UP = '''"""A module. Session 12 chose this."""
x = 1  # sessions 8 and 10 agreed
# see outputs/h200/2026-11-29-s9-call3 and `-call2`
# (call 3 of that session; calls 5 and 6 repeated it)


def f(v):
    """The fused kernel since v42 (v32b, v9–v10): 1.2× (run 11)."""
    return v  # PERFORMANCE.md has the numbers; GUIDE.md, traps


class C:
    """What issue 5 asks for. Next 3: try again."""
'''


def test_each_kind_is_caught_where_it_stands():
    assert history(MADE_UP) == sorted([
        (1, "Session 12"), (2, "sessions 8"), (3, "s9-call3"), (3, "-call2"), (4, "call 3"), (4, "calls 5"),
        (8, "v42"), (8, "v32b"), (8, "v9"), (8, "v10"), (8, "run 11"), (9, "PERFORMANCE"), (9, "GUIDE"),
        (13, "issue 5"), (13, "Next 3"),
    ])


CLEAN = '''"""O = P V for q, k, v: the autotune's run 1 of 3 times each candidate; a session's worth of work."""
v1 = 2  # v1 = the first half, v2[i] its i-th row, v3(x) a call; q, k, v as given
s = "session 12, run 7, v42 and PERFORMANCE.md in a string the code prints are not prose"


def run(v):
    """Runs the sweep, then calls the kernel; sm_90a, fp16x2, tiles.v2 and the run's folder are ordinary words."""
    return v  # the issue: none here
'''


def test_ordinary_words_and_code_do_not_match():
    assert history(CLEAN) == []
