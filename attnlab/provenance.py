"""Where a run's numbers came from: device, clocks, driver, software versions, host, git commit.

Everything is read, not assumed; a field that cannot be read on this machine is None, with the reason under
"notes", so a missing driver version is never confused with an empty one.
"""
from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnlab import environment

REPO = Path(__file__).resolve().parent.parent


def now() -> str:
    """ISO-8601 local time with its UTC offset, to the second."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


@functools.lru_cache(maxsize=None)
def device_name(device: str) -> str:
    """'NVIDIA H200' for a GPU; the CPU's model name (from /proc/cpuinfo where there is one) for 'cpu'."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _run(cmd: list[str], cwd=None) -> tuple[str | None, str]:
    """(stdout stripped, '') or (None, why it could not be read)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{cmd[0]}: {e}"
    if r.returncode != 0:
        return None, f"{' '.join(cmd[:2])}: exit {r.returncode}: {r.stderr.strip()[:200]}"
    return r.stdout.strip(), ""


CLOCK_FIELDS = ("driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem")
# what the card is doing now: a time that moved between two measurements is read against these
STATE_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


def gpu_clocks(device, fields=CLOCK_FIELDS) -> dict:
    """nvidia-smi's `fields` for the device (default: driver version, SM/memory clocks now and max, MHz), or Nones
    and the reason."""
    fields = list(fields)
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    out, why = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                     "-i", str(index)])
    if out is None:
        return {**{f: None for f in fields}, "note": why}
    values = [v.strip() for v in out.splitlines()[0].split(",")]
    return {**dict(zip(fields, values)), "note": ""}


def gpu_state(device) -> dict:
    """STATE_FIELDS now; where the driver refuses one (older drivers lack clocks_event_reasons, and nvidia-smi then
    answers nothing), the plain clocks at least, with the refusal in 'note'."""
    state = gpu_clocks(device, STATE_FIELDS)
    if state["note"]:
        state = {**gpu_clocks(device), "note": state["note"]}
    return state


@functools.lru_cache(maxsize=None)
def code_hash() -> str:
    """A fingerprint of the code that measures: sha1 of every attnlab/**/*.py, 12 hex digits.

    Unlike the git commit it exists where the tree travels without .git (the GPU machine) and it changes with
    uncommitted edits; rows carry it, so a table can say when a baseline was measured by other code."""
    import hashlib

    h = hashlib.sha1()
    pkg = Path(__file__).resolve().parent
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def git_state() -> dict:
    """The commit the code ran from and whether tracked files differed from it. ATTNLAB_COMMIT, where set, names the
    commit instead: a copy of a working tree sent to another machine (the GPU machine's) carries a .git whose HEAD is
    not the tree's, and the sender knows which commit it sent."""
    if environment.setting("ATTNLAB_COMMIT"):
        return dict(commit=environment.setting("ATTNLAB_COMMIT"), dirty=None, note="commit named by ATTNLAB_COMMIT")
    commit, why = _run(["git", "rev-parse", "HEAD"], cwd=REPO)
    if commit is None:
        return dict(commit=None, dirty=None, note=why)
    status, why = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    return dict(commit=commit, dirty=None if status is None else bool(status), note=why)


def device_info(device) -> dict:
    dev = torch.device(device)
    info = dict(device=str(dev), name=device_name(str(dev)))
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                    total_memory=p.total_memory, cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(), **gpu_clocks(dev))
    else:
        info.update(capability=None, cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                    note="CPU: no compute capability, driver or clocks")
    return info


def software() -> dict:
    import numpy
    import pandas
    import triton

    return dict(python=sys.version.split()[0], torch=torch.__version__, triton=triton.__version__,
                numpy=numpy.__version__, pandas=pandas.__version__, cuda=torch.version.cuda,
                triton_interpret="1" if environment.interpreting() else "")


def collect(device) -> dict:
    """Everything about this machine and checkout that a reader needs to trust or reproduce a run."""
    return dict(device=device_info(device), software=software(), host=socket.gethostname(),
                platform=platform.platform(), git=git_state(), code=code_hash())
