"""A grid of cases from a params file, measured one by one into an append-only, resumable results file.

    params/*.yaml ──load_params──> grid of Cases ──measure──> results.csv (one line per case, fsync'd as measured)
                                                              provenance.json (device, versions, git, params, ceilings)

Params keys (defaults in DEFAULTS; every other key is required):

    device        'auto' (CUDA if present, else CPU), 'cpu', 'cuda' or 'cuda:<i>'
    dtype         one of 'bfloat16', 'float16', 'float32'; one per run (ratios never mix dtypes)
    seq_lens      N values, each > 0              head_dims   D values, 1..256
    causal        list of booleans
    batch_policy  'fixed_tokens': B = tokens // N and H = width // D (FlashAttention's benchmarks: every shape
                  does about the same work per token) — keys `tokens`, `width`;
                  'fixed': the same B and H everywhere — keys `batch`, `heads`
    group         query heads per k/v head (1: no grouped-query attention); Hkv = H / group
    builds        'all', or a list of build names and the families 'ours', 'ablation', 'library'
    passes        the passes each build is timed in, of 'forward', 'backward', 'forward+backward' (default
                  forward); an ablation is timed forward only (an ablated program has no backward)
    warmup_ms, reps_ms, min_reps   timing (attnlab.measure); ref_budget_gib   fp64 reference budget
    seed          input seed (inputs depend on the shape and this only)
    out_dir       where results go (the --out flag wins); default outputs/<device>/<timestamp>

Every finished row is appended to results.csv at once as one whole line, flushed and fsync'd, so a crash loses no
finished row; reading it back (read_results) gives the forward rows, which every table and figure compares, unless
other passes are named. Re-running with the same out_dir and the same params measures only the cases whose case_id
is not there yet (a partial last line, from a crash mid-write, is dropped first). A resume on another device, or with other params
(but out_dir), is refused before anything is written: the rows and provenance.json describe one run. A case that runs out of memory is an 'oom' row and one that
raises is an 'error' row (attnlab.measure); the sweep frees memory and goes on. Bad params raise ParamsError
before anything is written.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch
import yaml

from attnlab import builds, measure as _measure, cost, provenance
from attnlab.ceilings import measure_ceilings
from attnlab.telemetry import LoadLog
from attnlab.schema import BEFORE_BACKWARD, COLUMNS, LATER, PASSES, TYPES
from attnlab.validate import DTYPES, MAX_HEAD_DIM

RESULTS = "results.csv"
PROVENANCE = "provenance.json"
POLICIES = {"fixed_tokens": ("tokens", "width"), "fixed": ("batch", "heads")}
DEFAULTS = dict(device="auto", causal=[False, True], group=1, warmup_ms=25.0, reps_ms=100.0, min_reps=5,
                ref_budget_gib=2.0, seed=0, out_dir=None, name="", passes=["forward"])
REQUIRED = ("dtype", "seq_lens", "head_dims", "batch_policy", "builds")
KNOWN = (*REQUIRED, *DEFAULTS, *(k for keys in POLICIES.values() for k in keys))
FAMILIES = {"ours": "ours", "ablation": "ablation", "ablations": "ablation", "library": "library"}
MISSING = object()


class ParamsError(ValueError):
    """A bad params value: `str()` is the one line the CLI prints, naming the key, the value and the rule."""

    def __init__(self, key, value, constraint: str):
        self.key, self.value, self.constraint = key, value, constraint
        if key is None:
            msg = f"params file {str(value)!r}: {constraint}"
        elif value is MISSING:
            msg = f"params key {key!r}: {constraint}"
        else:
            msg = f"params key {key!r}: value {value!r} {constraint}"
        super().__init__(" ".join(msg.split()))


# -- params -------------------------------------------------------------------------------------------------------

def load_params(path) -> dict:
    """Read a YAML params file (safe_load) and validate it; ParamsError names what is wrong."""
    return validate(read_yaml(path))


def read_yaml(path) -> dict:
    """A YAML params file's mapping (safe_load), not yet validated; ParamsError when it cannot be read, is not YAML
    or holds no mapping."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ParamsError(None, path, f"cannot be read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ParamsError(None, path, f"is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ParamsError(None, path, f"must hold a mapping of params keys, got {type(raw).__name__}")
    return raw


def valid_ints(key, value, lo, hi=None) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ParamsError(key, value, "must list at least one value")
    for x in values:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ParamsError(key, x, "must be an integer")
        if x < lo:
            raise ParamsError(key, x, f"must be >= {lo}" if lo != 1 else "must be > 0")
        if hi is not None and x > hi:
            raise ParamsError(key, x, f"must be <= {hi}")
    return list(dict.fromkeys(values))


def valid_number(key, value, *, integer=False, sign="> 0"):
    """An int (or any real, unless `integer`) satisfying `sign`: '> 0', '>= 0' or '' for any."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
        raise ParamsError(key, value, f"must be {kind}")
    if (sign == "> 0" and value <= 0) or (sign == ">= 0" and value < 0):
        raise ParamsError(key, value, f"must be {sign}")
    return value


def _builds(value) -> list[str]:
    if value == "all":
        return builds.names()
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ParamsError("builds", value, "must list at least one build, or be 'all'")
    out = []
    for name in values:
        if name in FAMILIES:
            out += [b.name for b in builds.BUILDS.values() if b.family == FAMILIES[name]]
        elif isinstance(name, str) and name in builds.BUILDS:
            out.append(name)
        else:
            raise ParamsError("builds", name, f"is not a build; known: 'all', {', '.join(FAMILIES)}, "
                                              f"{', '.join(builds.names())}")
    return list(dict.fromkeys(out))


def validate(raw: dict) -> dict:
    """Params with defaults filled in and every value checked; ParamsError at the first bad one."""
    for key in raw:
        if key not in KNOWN:
            raise ParamsError(key, raw[key], f"is not a params key; known: {', '.join(KNOWN)}")
    for key in REQUIRED:
        if key not in raw:
            raise ParamsError(key, MISSING, "is required")
    p = {**DEFAULTS, **raw}
    if p["dtype"] not in [str(d).removeprefix("torch.") for d in DTYPES]:
        raise ParamsError("dtype", p["dtype"], "must be one of bfloat16, float16, float32 (the dtypes our builds take)")
    p["seq_lens"] = valid_ints("seq_lens", p["seq_lens"], 1)
    p["head_dims"] = valid_ints("head_dims", p["head_dims"], 1, MAX_HEAD_DIM)
    causal = p["causal"] if isinstance(p["causal"], list) else [p["causal"]]
    if not causal or any(not isinstance(c, bool) for c in causal):
        raise ParamsError("causal", p["causal"], "must be a list of booleans (true/false)")
    p["causal"] = list(dict.fromkeys(causal))
    device = p["device"]
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise ParamsError("device", device, "must be 'auto', 'cpu', 'cuda' or 'cuda:<index>'")
    p["group"] = valid_number("group", p["group"], integer=True)
    policy = p["batch_policy"]
    if policy not in POLICIES:
        raise ParamsError("batch_policy", policy, f"must be one of {', '.join(POLICIES)}")
    for other, keys in POLICIES.items():
        for key in keys:
            if other != policy and key in raw:
                raise ParamsError(key, raw[key], f"belongs to batch_policy {other!r}, not {policy!r}")
            if other == policy:
                if key not in raw:
                    raise ParamsError(key, MISSING, f"is required by batch_policy {policy!r}")
                p[key] = valid_number(key, raw[key], integer=True)
    if policy == "fixed_tokens":
        for n in p["seq_lens"]:
            if p["tokens"] < n:
                raise ParamsError("tokens", p["tokens"], f"must be >= every seq_len (batch = tokens // N), got N={n}")
        for d in p["head_dims"]:
            if p["width"] % d:
                raise ParamsError("width", p["width"], f"must be a multiple of every head_dim (heads = width // D), "
                                                       f"got D={d}")
    heads = [p["heads"]] if policy == "fixed" else [p["width"] // d for d in p["head_dims"]]
    for h in heads:
        if h % p["group"]:
            raise ParamsError("group", p["group"], f"must divide the number of query heads, got H={h}")
    p["builds"] = _builds(p["builds"])
    passes = p["passes"] if isinstance(p["passes"], list) else [p["passes"]]
    if not passes or any(x not in PASSES for x in passes):
        raise ParamsError("passes", p["passes"], f"must list passes of {', '.join(PASSES)}")
    p["passes"] = list(dict.fromkeys(passes))
    p["warmup_ms"] = float(valid_number("warmup_ms", p["warmup_ms"], sign=">= 0"))
    for key in ("reps_ms", "ref_budget_gib"):
        p[key] = float(valid_number(key, p[key]))
    p["min_reps"] = valid_number("min_reps", p["min_reps"], integer=True)
    p["seed"] = valid_number("seed", p["seed"], integer=True, sign=">= 0")
    if p["out_dir"] is not None and not isinstance(p["out_dir"], str):
        raise ParamsError("out_dir", p["out_dir"], "must be a path (a string)")
    if not isinstance(p["name"], str):
        raise ParamsError("name", p["name"], "must be a string")
    return p


def resolve_device(params: dict) -> str:
    """The params' device made concrete and checked here: ParamsError if it or its dtype cannot run here."""
    device = params["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ParamsError("device", params["device"], "needs a CUDA GPU, and torch sees none here")
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ParamsError("device", params["device"], f"does not exist: {torch.cuda.device_count()} GPU(s) here")
        device = f"cuda:{index}"
        if params["dtype"] == "bfloat16" and not _bf16_ok(index):
            name = torch.cuda.get_device_name(index)
            raise ParamsError("dtype", params["dtype"], f"is not supported natively on {device} ({name})")
    return device


def _bf16_ok(index: int) -> bool:
    with torch.cuda.device(index):
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch: no emulation argument
            return torch.cuda.is_bf16_supported()


def device_tag(device: str) -> str:
    """'cpu', or the GPU's name as a folder name ('nvidia-h200')."""
    if not device.startswith("cuda"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", provenance.device_name(device).lower()).strip("-") or "gpu"


def default_out_dir(device: str) -> Path:
    return Path("outputs") / device_tag(device) / datetime.now().strftime("%Y%m%d-%H%M%S")


def check_out_dir(out: Path) -> None:
    """ParamsError unless `out` is, or can be made, a writable directory (checked before anything is written)."""
    if out.exists() and not out.is_dir():
        raise ParamsError("out_dir", str(out), "is a file, not a directory")
    up = out
    while not up.exists():
        up = up.parent
    if not up.is_dir():
        raise ParamsError("out_dir", str(out), f"cannot be created: {str(up)!r} is a file")
    if not os.access(up, os.W_OK | os.X_OK):
        raise ParamsError("out_dir", str(out), f"cannot be written: no write permission on {str(up)!r}")


def grid(params: dict, device: str) -> list[_measure.Case]:
    """Every case, shape by shape (causal, then D, then N ascending: the largest N of each (causal, D) last), every
    build at each shape in each of the params' passes (an ablation in the forward pass only)."""
    cases = []
    for causal in params["causal"]:
        for D in params["head_dims"]:
            for N in sorted(params["seq_lens"]):
                if params["batch_policy"] == "fixed_tokens":
                    B, H = params["tokens"] // N, params["width"] // D
                else:
                    B, H = params["batch"], params["heads"]
                for name in params["builds"]:
                    for pass_ in params["passes"]:
                        if pass_ == "forward" or not builds.get(name).ablation:
                            cases.append(_measure.Case(name, B, H, H // params["group"], N, D, params["dtype"],
                                                       causal, device, pass_))
    return cases


# -- the results file ---------------------------------------------------------------------------------------------

def csv_cell(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return " ".join(str(value).split()) if isinstance(value, str) else str(value)


def append_row(path: Path, row: dict) -> None:
    """One whole line, flushed and fsync'd: after this returns, a crash cannot lose the row."""
    if set(row) != set(COLUMNS):
        raise ValueError(f"row columns differ from the schema: {sorted(set(row) ^ set(COLUMNS))}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if not path.exists() or path.stat().st_size == 0:
        writer.writerow(COLUMNS)
    writer.writerow([csv_cell(row[c]) for c in COLUMNS])
    with open(path, "a", encoding="utf-8") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())


def complete_text(path: Path) -> str:
    """The file's text up to its last newline: a line cut short by a crash is not part of the results."""
    data = path.read_bytes() if path.exists() else b""
    return data[: data.rfind(b"\n") + 1].decode("utf-8")


def repair(path: Path) -> None:
    """Cut a partial last line off before appending after it (it would otherwise glue onto the next row)."""
    if path.exists():
        keep = len(complete_text(path).encode("utf-8"))
        if keep != path.stat().st_size:
            with open(path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())


FORWARD = ("forward",)


def read_results(path, *, passes=FORWARD) -> pd.DataFrame:
    """A results file as a typed table (attnlab.schema.TYPES): complete lines only, causal as bool, the rows of
    `passes` (the forward's, which every table and figure of the lab compares; None for every row). A file written
    before some of schema.LATER's columns existed reads with them unknown, and one written before the backward
    pass's columns with forward rows (schema.BEFORE_BACKWARD); such a table's attrs[OLDER] says why rows of the
    whole schema cannot follow them (a resumed sweep with cases left refuses it)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    text = complete_text(path)
    if not text:
        return pd.DataFrame({c: pd.Series(dtype=_PANDAS[TYPES[c]]) for c in COLUMNS})
    records = list(csv.reader(io.StringIO(text)))
    header = records[0]
    # an older file lacks some of LATER's or the backward's columns and has the rest in COLUMNS' order
    older = (header == [c for c in COLUMNS if c in header]
             and set(COLUMNS) - set(header) <= {*LATER, *BEFORE_BACKWARD})
    other = (f"{path} has columns of another schema ({sorted(set(header) ^ set(COLUMNS))} differ): measure into a "
             "fresh out_dir") if header != list(COLUMNS) else ""
    if other and not older:
        raise ValueError(other)
    short = [i + 1 for i, r in enumerate(records) if len(r) != len(records[0])]
    if short:  # cannot happen through append_row; say where rather than read a shifted table
        raise ValueError(f"{path}: line(s) {short[:5]} do not have the header's {len(records[0])} fields")
    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    for c in LATER:
        if c not in df:
            df[c] = ""
    for c, value in BEFORE_BACKWARD.items():
        if c not in df:
            df[c] = value
    df = df[list(COLUMNS)]
    for c in COLUMNS:
        kind = TYPES[c]
        if kind == "float":
            df[c] = df[c].replace("", "nan").astype(float)
        elif kind == "int":
            df[c] = df[c].astype("int64")
        elif kind == "bool":
            df[c] = df[c].map({"True": True, "False": False}).astype(bool)
    df["pass"] = df["pass"].where(df["pass"].isin(PASSES), BEFORE_BACKWARD["pass"])  # a row naming none: forward
    df = df if passes is None else df[df["pass"].isin(list(passes))].reset_index(drop=True)
    if other:
        df.attrs[OLDER] = other
    return df


OLDER = "older"  # read_results' attrs key: why an older file's rows take no rows of the whole schema after them
_PANDAS = {"str": object, "float": float, "int": "int64", "bool": bool}


# -- provenance ---------------------------------------------------------------------------------------------------

def write_json(path: Path, data: dict) -> None:
    """Whole or not at all: write beside, fsync, rename over."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- the sweep ----------------------------------------------------------------------------------------------------

def run(params, out_dir=None, *, progress: bool = True, bar=None, files: tuple[str, str] = (RESULTS, PROVENANCE)
        ) -> pd.DataFrame:
    """Measure every case of `params` (a path or a dict) not yet in out_dir's results; return its forward rows
    (read_results: read_results(out_dir, passes=None) gives every pass's). `bar`:
    the tqdm class that draws the progress (tqdm.auto's unless given; the walkthrough passes one that leaves a single
    line on a rendered page). `files`: the results file's and the provenance's names in out_dir (a training sweep,
    attnlab.train_sweep, names its own, so that attnlab.runs never takes it for an attention run).

    Checks every param, the device and out_dir before writing anything (ParamsError). Ceilings are measured once
    per run and kept in provenance.json, so a resumed run states its % of ceiling against the same figures."""
    p = load_params(params) if isinstance(params, (str, os.PathLike)) else validate(dict(params))
    device = resolve_device(p)
    out = Path(out_dir or p["out_dir"] or default_out_dir(device))
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    results, prov_path = out / files[0], out / files[1]
    try:
        measured = read_results(results, passes=None)
    except ValueError as e:
        raise ParamsError("out_dir", str(out), f"cannot be resumed: {e}") from None
    done = set(measured["case_id"])
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    here = provenance.collect(device)
    name = here["device"]["name"]
    if prov and prov.get("device", {}).get("name") not in (None, name):  # before repair: refuse, write nothing
        raise ParamsError("out_dir", str(out), f"holds a run measured on {prov['device']['name']!r}, this is "
                                               f"{name!r}: use another out_dir")
    changed = _changed_params(prov.get("params"), p)
    if changed:
        raise ParamsError("out_dir", str(out), f"holds a run measured with other params ({changed}): resume it with "
                                               "the params it was started with, or use another out_dir")
    repair(results)
    cases = grid(p, device)
    todo = [c for c in cases if c.case_id not in done]
    # rows of the whole schema go only after rows of it; a finished older run renders as it is
    if todo and OLDER in measured.attrs:
        raise ParamsError("out_dir", str(out), f"cannot be resumed: {measured.attrs[OLDER]}")
    # each session names its own commit and code: a resumed run's rows may come from more than one
    session = dict(started=provenance.now(), ended=None, params=p, cases=len(cases), already_measured=len(cases)
                   - len(todo), measured=0, interrupted=None, clocks_start=_clocks(device), git=here.get("git"),
                   code=here.get("code"))
    ceilings = prov.get("ceilings", {}).get(p["dtype"])
    if ceilings is None:
        ceilings = measure_ceilings(device, p["dtype"])
    prov = {**here, "run_id": out.name, "results": files[0], "params": prov.get("params", p),
            "started": prov.get("started", session["started"]), "ended": None,
            "ceilings": {**prov.get("ceilings", {}), p["dtype"]: ceilings},
            "sessions": [*prov.get("sessions", []), session]}
    write_json(prov_path, prov)

    finished = False
    try:
        from tqdm.auto import tqdm

        bar = (bar or tqdm)(todo, total=len(cases), initial=len(cases) - len(todo), unit="case",
                            disable=not progress, dynamic_ncols=True)
        with LoadLog(device) as log:  # each row's clock, power and clock-event reasons while it was timed
            for case in bar:
                bar.set_description_str(case.case_id)
                kw = dict(ceilings=ceilings, run_id=out.name)
                try:
                    row = _measure.measure(case, reps_ms=p["reps_ms"], warmup_ms=p["warmup_ms"],
                                           min_reps=p["min_reps"], seed=p["seed"], load=log,
                                           ref_budget_bytes=int(p["ref_budget_gib"] * cost.GiB), **kw)
                except Exception as e:  # measure turns build failures into rows; this is a failure of measure itself
                    row = _measure.rates(_measure.base_row(case, **kw))
                    row["status"] = _measure.failure_status(e, row["hold_bytes"])
                    _measure.release(torch.device(device))  # measure frees after its own failures; not this one
                append_row(results, row)
                session["measured"] += 1
        bar.close()
        finished = True
    finally:
        session.update(ended=provenance.now(), interrupted=not finished, clocks_end=_clocks(device))
        prov["ended"] = session["ended"]
        write_json(prov_path, prov)
    df = read_results(results)
    df.attrs["out_dir"] = str(out)
    return df


RESUMABLE = ("out_dir",)  # params a resumed run may change: where it is written, not what its rows measured


def _changed_params(before: dict | None, now: dict) -> str:
    """'' when `now` (validated params) measures what `before` (the run's provenance params) did, else each params
    key that differs with its value then and now, as one phrase. A run's rows and its provenance describe one set of
    params: a resume with others would append rows measured differently, or cases the provenance does not list."""
    if not before:
        return ""
    now = json.loads(json.dumps(now, default=str))  # as provenance.json holds them
    keys = [k for k in dict.fromkeys([*before, *now]) if k not in RESUMABLE]
    diffs = [f"{k}: {before.get(k, DEFAULTS.get(k))!r} then, {now.get(k, DEFAULTS.get(k))!r} now" for k in keys
             if before.get(k, DEFAULTS.get(k)) != now.get(k, DEFAULTS.get(k))]
    return "; ".join(diffs)


def _clocks(device: str) -> dict:
    """The card's clocks, power, temperature and clock-event reasons now (provenance.gpu_state), read at each
    session's start and end; {} on a CPU."""
    return provenance.gpu_state(device) if device.startswith("cuda") else {}
