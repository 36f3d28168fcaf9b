"""Whole model forwards over a grid of model configs, sequence lengths and batches, one row per build, appended as
measured into a resumable results file with its provenance.

    params/model/*.yaml ──load_params──> grid ──model_forward.measure_forward──> model_results.csv (one line a row)
                                                                                  model_provenance.json

    python -m attnlab.model_sweep --params params/model/cpu.yaml [--out DIR]

Params keys (defaults in DEFAULTS; the others are required):

    device      'auto' (CUDA if present, else CPU), 'cpu', 'cuda' or 'cuda:<i>'
    dtype       'bfloat16', 'float16' or 'float32': the model's dtype
    models      a list of model configs, each {name, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab}
                and optionally model_type (default 'llama'): built with random weights, nothing downloaded
    seq_lens    N values (tokens per sequence)        batches   B values
    max_tokens  B·N above this is skipped (null: none)
    builds      'transformers_sdpa', 'transformers_eager', attnlab build names (ours and library rows) and the
                families 'ours' and 'library'. transformers_sdpa (the logits' reference) and copy_v (attention
                replaced by a copy of V: the forward without attention's work) are always measured, first
    baseline    the build whose forward and attention the speedups are over (default: materialised)
    windows, reps_ms, min_reps   timing (attnlab.model_forward: eager windows, their median and spread)
    compile_modes   torch.compile modes to measure the forward in as well, as deployed (e.g. [reduce-overhead];
                    default none): one more row per mode for each of compile_builds
    compile_builds  the builds measured compiled (names or families as in builds; default: transformers_sdpa and
                    those of ours in builds)
    seed        weights and token ids (the same model for every build)
    out_dir     where results go (--out wins); default outputs/<device>/<time>

The file names differ from the attention sweep's (results.csv, provenance.json) on purpose: attnlab.runs looks for
those to find the attention runs, and a model run is not one. Rows are written as in attnlab.sweep: one whole line,
fsync'd, a partial last line dropped before appending, a resumed run measuring only missing case_ids.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
import yaml

from attnlab import builds, hf_attention, model_forward as mf, provenance, sweep
from attnlab.args import Parser, existing_file, out_dir as out_dir_arg
from attnlab.sweep import ParamsError

RESULTS = "model_results.csv"
PROVENANCE = "model_provenance.json"
PARAMS = "model_params.yaml"  # the model page's params, as its parameters cell validated them
ALWAYS = (mf.REFERENCE, mf.ABLATED)  # measured at every shape, first: the logits' reference, attention ablated
FAMILIES = ("ours", "library")
DEFAULTS = dict(device="auto", batches=[1], max_tokens=None, builds=["transformers_eager", "ours"],
                baseline="materialised", windows=3, reps_ms=100.0, min_reps=3, seed=0, out_dir=None, name="",
                compile_modes=[], compile_builds=None)
REQUIRED = ("dtype", "models", "seq_lens")
MODEL_KEYS = ("name", "model_type", *mf.SPEC_KEYS)


# -- params -------------------------------------------------------------------------------------------------------

def load_params(path) -> dict:
    """A YAML params file read and validated; ParamsError names what is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ParamsError(None, path, f"cannot be read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ParamsError(None, path, f"is not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ParamsError(None, path, f"must hold a mapping of params keys, got {type(raw).__name__}")
    return validate(raw)


def _spec(i: int, raw) -> mf.ModelSpec:
    key = f"models[{i}]"
    if not isinstance(raw, dict):
        raise ParamsError(key, raw, "must be a mapping of " + ", ".join(MODEL_KEYS))
    unknown = [k for k in raw if k not in MODEL_KEYS]
    if unknown:
        raise ParamsError(f"{key}.{unknown[0]}", raw[unknown[0]], f"is not a model key; known: {', '.join(MODEL_KEYS)}")
    missing = [k for k in ("name", *mf.SPEC_KEYS) if k not in raw]
    if missing:
        raise ParamsError(f"{key}.{missing[0]}", sweep.MISSING, "is required")
    if not isinstance(raw["name"], str) or not raw["name"] or "|" in raw["name"]:
        raise ParamsError(f"{key}.name", raw["name"], "must be a non-empty string without '|'")
    for k in mf.SPEC_KEYS:
        sweep.valid_number(f"{key}.{k}", raw[k], integer=True)
    try:
        return mf.ModelSpec(**raw)
    except ValueError as e:
        raise ParamsError(key, raw["name"], str(e).split(": ", 1)[-1]) from None


def known_builds() -> list[str]:
    return [*mf.TRANSFORMERS, *hf_attention.REGISTERED]


def _builds(value, always=ALWAYS) -> list[str]:
    values = value if isinstance(value, list) else [value]
    out = list(always)
    for name in values:
        if name in FAMILIES:
            out += [b for b in hf_attention.REGISTERED if builds.get(b).family == name]
        elif name in known_builds() or name == mf.ABLATED:
            out.append(name)
        else:
            raise ParamsError("builds", name, f"is not a build here; known: {', '.join(FAMILIES)}, "
                                              f"{', '.join(known_builds())}")
    return list(dict.fromkeys(out))


def validate(raw: dict) -> dict:
    """Params with defaults filled in and every value checked; ParamsError at the first bad one."""
    known = (*REQUIRED, *DEFAULTS)
    for key in raw:
        if key not in known:
            raise ParamsError(key, raw[key], f"is not a params key; known: {', '.join(known)}")
    for key in REQUIRED:
        if key not in raw:
            raise ParamsError(key, sweep.MISSING, "is required")
    p = {**DEFAULTS, **raw}
    if p["dtype"] not in ("bfloat16", "float16", "float32"):
        raise ParamsError("dtype", p["dtype"], "must be one of bfloat16, float16, float32 (the dtypes our builds take)")
    if not isinstance(p["models"], list) or not p["models"]:
        raise ParamsError("models", p["models"], "must list at least one model config")
    specs = [_spec(i, m) for i, m in enumerate(p["models"])]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ParamsError("models", names, "must name each model config once")
    p["models"] = [asdict(s) for s in specs]
    p["seq_lens"] = sweep.valid_ints("seq_lens", p["seq_lens"], 1)
    p["batches"] = sweep.valid_ints("batches", p["batches"], 1)
    if p["max_tokens"] is not None:
        p["max_tokens"] = sweep.valid_number("max_tokens", p["max_tokens"], integer=True)
        smallest = min(p["seq_lens"]) * min(p["batches"])
        if smallest > p["max_tokens"]:
            raise ParamsError("max_tokens", p["max_tokens"], f"leaves no shape: the smallest B·N is {smallest}")
    if not isinstance(p["device"], str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", p["device"]):
        raise ParamsError("device", p["device"], "must be 'auto', 'cpu', 'cuda' or 'cuda:<index>'")
    p["builds"] = _builds(p["builds"])
    modes = p["compile_modes"] if isinstance(p["compile_modes"], list) else [p["compile_modes"]]
    for mode in modes:
        if mode not in mf.COMPILE_MODES:
            raise ParamsError("compile_modes", mode, f"is not a torch.compile mode; known: {', '.join(mf.COMPILE_MODES)}")
    p["compile_modes"] = list(dict.fromkeys(modes))
    if p["compile_builds"] is None:
        p["compile_builds"] = [b for b in _builds([mf.REFERENCE, "ours"], always=()) if b in p["builds"]]
    p["compile_builds"] = _builds(p["compile_builds"], always=())
    unmeasured = [b for b in p["compile_builds"] if b not in p["builds"]]
    if unmeasured:
        raise ParamsError("compile_builds", unmeasured[0], "must be one of the builds measured eagerly: "
                                                           f"{', '.join(p['builds'])}")
    if p["baseline"] not in p["builds"]:
        raise ParamsError("baseline", p["baseline"], f"must be one of the builds measured: {', '.join(p['builds'])}")
    p["windows"] = sweep.valid_number("windows", p["windows"], integer=True)
    p["min_reps"] = sweep.valid_number("min_reps", p["min_reps"], integer=True)
    p["reps_ms"] = float(sweep.valid_number("reps_ms", p["reps_ms"]))
    p["seed"] = sweep.valid_number("seed", p["seed"], integer=True, sign=">= 0")
    if p["out_dir"] is not None and not isinstance(p["out_dir"], str):
        raise ParamsError("out_dir", p["out_dir"], "must be a path (a string)")
    if not isinstance(p["name"], str):
        raise ParamsError("name", p["name"], "must be a string")
    return p


def specs(p: dict) -> list[mf.ModelSpec]:
    return [mf.ModelSpec(**m) for m in p["models"]]


def shapes(p: dict) -> list[tuple[int, int]]:
    """(B, N) pairs, N ascending then B, those above max_tokens left out."""
    return [(B, N) for N in sorted(p["seq_lens"]) for B in sorted(p["batches"])
            if p["max_tokens"] is None or B * N <= p["max_tokens"]]


def grid(p: dict) -> list[tuple[mf.ModelSpec, int, int, str, str]]:
    """Every (model, B, N, build, mode) in measuring order: model by model, shape by shape, the ALWAYS builds first,
    every build eagerly, then the compile_builds in each compile mode."""
    return [(s, B, N, b, m) for s in specs(p) for B, N in shapes(p)
            for m in (mf.EAGER, *p["compile_modes"]) for b in (p["builds"] if m == mf.EAGER else p["compile_builds"])]


# -- the results file ---------------------------------------------------------------------------------------------

def append_row(path: Path, row: dict) -> None:
    """One whole line, flushed and fsync'd (attnlab.sweep.append_row's rule, with this file's columns)."""
    if set(row) != set(mf.COLUMNS):
        raise ValueError(f"row columns differ from the schema: {sorted(set(row) ^ set(mf.COLUMNS))}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if not path.exists() or path.stat().st_size == 0:
        writer.writerow(mf.COLUMNS)
    writer.writerow([sweep.csv_cell(row[c]) for c in mf.COLUMNS])
    with open(path, "a", encoding="utf-8") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())


UNMODED = ("mode", "graph_breaks")  # the columns an eager-only results file may lack


def read_results(path, modes=(mf.EAGER,)) -> pd.DataFrame:
    """A model results file (or its folder) as a typed table, complete lines only: the rows of `modes` (the eager
    forward's, which every section but the deployed one compares; None: every row)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    text = sweep.complete_text(path)
    if not text:
        return pd.DataFrame({c: pd.Series(dtype={"str": object, "float": float, "int": "int64"}[mf.TYPES[c]])
                             for c in mf.COLUMNS})
    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    if "mode" not in df.columns and list(df.columns) == [c for c in mf.COLUMNS if c not in UNMODED]:
        df.insert(list(mf.COLUMNS).index("mode"), "mode", mf.EAGER)  # a file without modes: every row eager
        df.insert(list(mf.COLUMNS).index("graph_breaks"), "graph_breaks", "")
    if list(df.columns) != list(mf.COLUMNS):
        raise ValueError(f"{path} has columns of another schema ({sorted(set(df.columns) ^ set(mf.COLUMNS))} "
                         "differ): measure into a fresh out_dir")
    for c, kind in mf.TYPES.items():
        if kind == "float":
            df[c] = df[c].replace("", "nan").astype(float)
        elif kind == "int":
            df[c] = df[c].astype("int64")
    return df if modes is None else df[df["mode"].isin(modes)].reset_index(drop=True)


def software() -> dict:
    import transformers

    return {**provenance.software(), "transformers": transformers.__version__}


# -- the sweep ----------------------------------------------------------------------------------------------------

def run(params, out_dir=None, *, progress: bool = True, bar=None) -> pd.DataFrame:
    """Measure every row of `params` (a path or a dict) not yet in out_dir's results; return all its rows. Bad
    params, a device that is not here, an unwritable out_dir or a missing transformers fail before anything is
    written. `bar`: the tqdm class that draws the progress (a notebook passes one that ends as a line of text;
    tqdm.auto's by default)."""
    p = load_params(params) if isinstance(params, (str, os.PathLike)) else validate(dict(params))
    hf_attention.require()
    device = sweep.resolve_device(p)
    out = Path(out_dir or p["out_dir"] or sweep.default_out_dir(device))
    sweep.check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    results, prov_path = out / RESULTS, out / PROVENANCE
    try:
        done = set(read_results(results, modes=None)["case_id"])
    except ValueError as e:
        raise ParamsError("out_dir", str(out), f"cannot be resumed: {e}") from None
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    here = provenance.collect(device)
    if prov and prov.get("device", {}).get("name") not in (None, here["device"]["name"]):
        raise ParamsError("out_dir", str(out), f"holds a run measured on {prov['device']['name']!r}, this is "
                                               f"{here['device']['name']!r}: use another out_dir")
    sweep.repair(results)
    todo = [c for c in grid(p) if mf.case_id(c[0], c[1], c[2], p["dtype"], c[3], c[4]) not in done]
    session = dict(started=provenance.now(), ended=None, params=p, rows=len(grid(p)), already_measured=len(grid(p))
                   - len(todo), measured=0, interrupted=None)
    prov = {**here, "software": software(), "run_id": out.name, "results": RESULTS, "params": prov.get("params", p),
            "started": prov.get("started", session["started"]), "ended": None,
            "sessions": [*prov.get("sessions", []), session]}
    sweep.write_json(prov_path, prov)
    finished = False
    try:
        if bar is None:
            from tqdm.auto import tqdm as bar
        bar = bar(total=len(grid(p)), initial=len(grid(p)) - len(todo), unit="forward", disable=not progress)
        for spec in specs(p):
            mine = [c for c in todo if c[0] == spec]
            if not mine:
                continue
            model = mf.build(spec, dtype=p["dtype"], device=device, seed=p["seed"])
            for B, N in dict.fromkeys((c[1], c[2]) for c in mine):
                ref = mf.references(model, spec, B, N, p["seed"])
                for _, _, _, name, mode in [c for c in mine if (c[1], c[2]) == (B, N)]:
                    bar.set_description_str(mf.case_id(spec, B, N, p["dtype"], name, mode))
                    row = mf.measure_forward(model, spec, name, B, N, ref=ref, seed=p["seed"], windows=p["windows"],
                                             reps_ms=p["reps_ms"], min_reps=p["min_reps"], run_id=out.name,
                                             mode=mode)
                    append_row(results, row)
                    session["measured"] += 1
                    bar.update()
                ref = None
            model = None
            _free(device)
        bar.close()
        finished = True
    finally:
        session.update(ended=provenance.now(), interrupted=not finished)
        prov["ended"] = session["ended"]
        sweep.write_json(prov_path, prov)
    df = read_results(results, modes=None)
    df.attrs["out_dir"] = str(out)
    return df


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = Parser(prog="python -m attnlab.model_sweep", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, type=existing_file, metavar="FILE", help="params YAML")
    ap.add_argument("--out", type=out_dir_arg, metavar="DIR", help="run folder (a folder holding rows resumes)")
    args = ap.parse_args(argv)
    try:
        df = run(args.params, args.out)
    except (ParamsError, ImportError) as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    ok = int((df["status"] == "ok").sum())
    print(f"attnlab: {len(df)} rows ({ok} ok) in {Path(df.attrs['out_dir']) / RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
