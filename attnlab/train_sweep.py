"""Training's measurements: every build with a backward, at every shape of a params file, in every pass, one row
each, appended as measured into a resumable results file with its provenance.

    params/training/*.yaml ──load_params──> grid ──measure──> train_results.csv (one line a row, fsync'd)
                                                              train_provenance.json (device, versions, ceilings)

    python -m attnlab.train_sweep --params params/training/cpu.yaml [--out DIR]

The params keys are the attention sweep's (attnlab.sweep documents each), with training's rules on top:

    builds   names with a backward (attnlab.builds.training.names()), the families 'ours' and 'library', or 'all'
             (every build with one); an ablation is a forward-only program and is refused by name
    passes   of 'forward', 'backward', 'forward+backward', at least one of the last two (default: all three)
    model_step  optional: a real model's training step (attnlab.model_train), one shape, measured after the grid
             into model_train.csv beside the rows: {model: {name, layers, hidden, heads, kv_heads, head_dim,
             intermediate, vocab[, model_type]}, batch, seq_len, builds}, in the params' dtype, on their device.
             It needs transformers (the lab's `model` extra); without it the step is left out

A row is attnlab.measure's (the one pipeline, its Graphed timer): the pass timed as CUDA-graph replays where the call
can be captured (a backward alone cannot: its forward ran outside the capture; the row's timer and timing_note say
which), the wall clock around each call on a CPU; held_bytes, what the forward leaves allocated for the backward
beyond its inputs and output; the peak of one call; the gradients against the fp64 oracle (err, err_limit); and the
status: a case that runs out of memory is an 'oom: <bytes wanted> ...' row, never a crash, so materialised runs at
every N and its rows say where memory ran out. Reading the file back (read_results) adds the byte model's columns
beside the measured ones (MODEL_COLUMNS, from attnlab.cost): what the build must save for its backward, the
backward's FLOPs and bytes, and the FLOPs it spends recomputing S.

The files are named apart from the attention sweep's results.csv and provenance.json (TRAIN_FILES), as the model
sweep's are: attnlab.runs finds attention runs by those names, and a training run is not one. Resuming is the
attention sweep's (attnlab.sweep.run): the same out_dir and params measure only the cases not there yet; other params,
another device, or bad params are refused with one line before anything is written.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from attnlab import cost, hf_attention, model_forward as mf, model_train, sweep
from attnlab.args import Parser, existing_file, out_dir as out_dir_arg
from attnlab.builds import training
from attnlab.measure import Case
from attnlab.schema import PASSES
from attnlab.sweep import ParamsError

RESULTS = "train_results.csv"
PROVENANCE = "train_provenance.json"
PARAMS = "train_params.yaml"  # the training page's params, as its parameters cell validated them
TRAIN_FILES = (RESULTS, PROVENANCE)
MODEL_STEP = "model_train.csv"  # the real model's training step, one row per build (attnlab.model_train.COLUMNS)
STEP_KEYS = ("model", "batch", "seq_len", "builds")
BACKWARD_PASSES = ("backward", "forward+backward")
DEFAULTS = dict(passes=list(PASSES))
# The byte model's columns read_results adds to each row (attnlab.cost, from the row's build and shape):
MODEL_COLUMNS = {
    "saved_bytes": "bytes the build must keep from forward to backward: P, or a float32 logsumexp a query row",
    "backward_flops": "the backward's FLOPs: 8·B·H·N²·D, 10 where no P was saved (S recomputed), halved for causal",
    "backward_bytes": "the fewest bytes the backward moves through device memory",
    "recompute_flops": "FLOPs the backward spends recomputing S = QKᵀ (0 for a build that saved P)",
}


# -- params -------------------------------------------------------------------------------------------------------

def load_params(path) -> dict:
    """A YAML params file read and validated (validate); ParamsError names what is wrong."""
    return validate(sweep.read_yaml(path))


def validate(raw: dict) -> dict:
    """Params with defaults filled in and every value checked (the attention sweep's rules, then training's):
    ParamsError at the first bad one."""
    raw = {**DEFAULTS, **raw}
    step = model_step(raw.pop("model_step", None))
    if raw.get("builds") == "all":
        raw["builds"] = training.names()
    p = sweep.validate(raw)
    for name in p["builds"]:
        if name not in training.names():
            raise ParamsError("builds", name, f"has no backward (an ablation is a forward-only program); the builds "
                                              f"with one: {', '.join(training.names())}")
    if not set(BACKWARD_PASSES) & set(p["passes"]):
        raise ParamsError("passes", p["passes"], f"must include {' or '.join(map(repr, BACKWARD_PASSES))}: a "
                                                 "training sweep times the backward")
    return {**p, "model_step": step}


def model_step(raw) -> dict | None:
    """The params' model_step checked (module docstring), or None where there is none; ParamsError names what is
    wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != set(STEP_KEYS):
        raise ParamsError("model_step", raw, f"must be a mapping of exactly {', '.join(STEP_KEYS)}")
    model = raw["model"]
    known = ("name", "model_type", *mf.SPEC_KEYS)
    if not isinstance(model, dict) or not {"name", *mf.SPEC_KEYS} <= set(model) <= set(known):
        raise ParamsError("model_step.model", model, f"must be a mapping of {', '.join(known)} (model_type optional)")
    try:
        spec = mf.ModelSpec(**model)
    except (TypeError, ValueError) as e:
        raise ParamsError("model_step.model", model, str(e).split(": ", 1)[-1]) from None
    step = dict(model=asdict(spec), batch=sweep.valid_number("model_step.batch", raw["batch"], integer=True),
                seq_len=sweep.valid_number("model_step.seq_len", raw["seq_len"], integer=True))
    if step["seq_len"] < 2:
        raise ParamsError("model_step.seq_len", step["seq_len"], "must be >= 2 (the loss predicts each next token)")
    names = raw["builds"] if isinstance(raw["builds"], list) else [raw["builds"]]
    for name in names or [None]:
        if name not in model_train.BUILDS:
            raise ParamsError("model_step.builds", name, f"is not a build with a backward here; known: "
                                                         f"{', '.join(model_train.BUILDS)}")
    return {**step, "builds": list(dict.fromkeys(names))}


def grid(p: dict, device: str) -> list[Case]:
    """Every case, in measuring order (attnlab.sweep.grid): causal, then D, then N ascending, each build in each
    pass."""
    return sweep.grid(p, device)


# -- the results --------------------------------------------------------------------------------------------------

def read_results(path) -> pd.DataFrame:
    """A training results file (or its folder) as a typed table, every pass's rows, with the byte model's columns
    (MODEL_COLUMNS) beside the measured ones."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    return with_model(sweep.read_results(path, passes=None))


def with_model(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with MODEL_COLUMNS added, each from attnlab.cost at the row's build and shape."""
    rows = rows.copy()
    cases = [Case(r.build, int(r.B), int(r.H), int(r.Hkv), int(r.N), int(r.D), str(r.dtype), bool(r.causal))
             for r in rows[["build", "B", "H", "Hkv", "N", "D", "dtype", "causal"]].itertuples()]
    for column in MODEL_COLUMNS:
        rows[column] = pd.Series([getattr(cost, column)(c) for c in cases], index=rows.index, dtype="int64")
    return rows


# -- the sweep ----------------------------------------------------------------------------------------------------

def run(params, out_dir=None, *, progress: bool = True, bar=None) -> pd.DataFrame:
    """Measure every case of `params` (a path or a dict) not yet in out_dir's results (attnlab.sweep.run into
    TRAIN_FILES); return every row (read_results). Bad params fail before anything is written."""
    p = load_params(params) if isinstance(params, (str, os.PathLike)) else validate(dict(params))
    step = p.pop("model_step")
    df = sweep.run(p, out_dir, progress=progress, bar=bar, files=TRAIN_FILES)
    out = df.attrs["out_dir"]
    if step is not None:
        measure_step(step, p, Path(out))
    rows = read_results(out)
    rows.attrs["out_dir"] = out
    return rows


def measure_step(step: dict, p: dict, out: Path) -> pd.DataFrame | None:
    """The real model's training step (attnlab.model_train.measure) into out/MODEL_STEP, unless that file is there
    already (a resumed run); its rows, or None where transformers is not installed."""
    path = out / MODEL_STEP
    if path.exists():
        return read_step(out)
    if not hf_attention.available():
        return None
    rows = model_train.measure(mf.ModelSpec(**step["model"]), step["builds"], B=step["batch"], N=step["seq_len"],
                               dtype=p["dtype"], device=sweep.resolve_device(p), seed=p["seed"], reps_ms=p["reps_ms"],
                               min_reps=p["min_reps"])
    rows.to_csv(path, index=False)
    return rows


def read_step(out) -> pd.DataFrame | None:
    """The real model's training step rows in run folder `out`, or None where it holds none."""
    path = Path(out) / MODEL_STEP
    if not path.exists():
        return None
    rows = pd.read_csv(path, keep_default_na=False, na_values=[""])
    for c in ("grad_rel_tensor", "over_limit_at", "peak_note", "timer", "note", "status"):
        rows[c] = rows[c].fillna("").astype(str)
    return rows


def main(argv=None) -> int:
    ap = Parser(prog="python -m attnlab.train_sweep", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, type=existing_file, metavar="FILE", help="params YAML")
    ap.add_argument("--out", type=out_dir_arg, metavar="DIR", help="run folder (a folder holding rows resumes)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        df = run(args.params, args.out, progress=not args.quiet)
    except ParamsError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted; finished rows are kept: re-run with the same --out to resume", file=sys.stderr)
        return 130
    ok = int((df["status"] == "ok").sum())
    oom = int(df["status"].str.startswith("oom").sum())
    print(f"attnlab: {len(df)} rows ({ok} ok, {oom} out of memory) in {Path(df.attrs['out_dir']) / RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
