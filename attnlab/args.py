"""Command-line arguments checked before any work: one line naming the argument and the constraint, exit status 2.

Every command (`attnlab check | bench | sweep | run | report`, `python -m attnlab.selfcheck | warm | triton.resources`)
builds its parser from `Parser` and its typed arguments from the converters here, so a bad value is refused the same
way everywhere, before a kernel compiles or a folder is written:

    attnlab check: error: argument --ns: expected whole numbers >= 1, comma-separated, got '-5'
"""
from __future__ import annotations

import argparse
import os
import sys

DEVICES = ("auto", "cpu", "cuda")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (`prog: error: message`) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse's hook
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def ints(lo: int = 1):
    """A converter for a comma-separated list of whole numbers >= lo ('512,1024')."""

    def convert(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",")]
        except ValueError:
            values = None
        if not values or any(v < lo for v in values):
            raise argparse.ArgumentTypeError(f"expected whole numbers >= {lo}, comma-separated, got {text!r}")
        return values

    return convert


def _positive(cast, what: str):
    """A converter for one number of type `cast` > 0 (`what` names it in the error)."""

    def convert(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return convert


positive_int = _positive(int, "a whole number >= 1")
positive_float = _positive(float, "a number > 0")


def choices(allowed, what: str = "names"):
    """A converter for a comma-separated subset of `allowed` (kept in the order given)."""

    def convert(text: str) -> list[str]:
        picked = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in picked if x not in allowed]
        if not picked or bad:
            raise argparse.ArgumentTypeError(f"expected {what} from {', '.join(allowed)}, comma-separated; "
                                             f"got {text!r}")
        return picked

    return convert


def device(text: str) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N' (the form str(torch.device) gives, which the lab's own children receive);
    a CUDA device only where torch sees it."""
    kind, _, index = text.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(DEVICES)} or cuda:N, got {text!r}")
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text} was asked for, but torch sees no CUDA GPU on this machine")
        if index and int(index) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text} was asked for, but torch sees {torch.cuda.device_count()} "
                                             "CUDA GPU(s) on this machine")
    return text


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def existing_dir(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no such directory: {text!r}")
    return text


def out_dir(text: str) -> str:
    """A directory to write into: absent (it is made) or a directory, never an existing file."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory to write into")
    return text


def out_file(text: str) -> str:
    """A file to write: not a directory, in a directory that exists."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file to write")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"the folder {parent!r} of {text!r} does not exist")
    return text
