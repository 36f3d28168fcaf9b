# Two commands do all set-up on a fresh machine (and a third opens JupyterLab):
#   make run    the walkthrough (notebooks/attention_lab.ipynb) rendered by papermill with the params for the device
#               present (params/<gpu>.yaml, params/gpu.yaml, or params/cpu.yaml without a GPU) into a new
#               outputs/<gpu-or-cpu>/<time>/: the executed notebook, its HTML (draws offline), results, provenance
#   make lab    JupyterLab on notebooks/, with this environment's kernel
#   make test   the test suite (CPU; Triton kernels in Triton's interpreter), without the `system` tests
#   make test-system  the tests that drive real outside systems: Chromium, ptxas for sm_90a, a real Slurm
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is pinned here, before anything else asks for it: an unpinned torch pulls a multi-GB CUDA build.
# Without a GPU, triton is pinned to the GPU image's 3.6.0 for its interpreter; with one, torch brings its own.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_PINS := torch==2.13.0 $(if $(HAS_GPU),,triton==3.6.0)

.PHONY: install run lab test test-system clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e '.[lab,test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/attnlab run

# JUPYTER_PREFER_ENV_PATH: this environment's python3 kernel before any user-level kernelspec of that name
lab: $(STAMP)
	JUPYTER_PREFER_ENV_PATH=1 $(BIN)/jupyter lab notebooks/

# Two test processes (pytest-xdist); the sm_90a compiles the tests read run beside them, each once, shared out among
# the processes (tests/offline.py). --dist loadfile keeps a file's tests on one process: the browser tests share one
# JupyterLab server and one run of the walkthrough. --durations names the slowest tests, to keep the suite short.
# `make test` leaves out the tests marked `system`, which drive real outside systems (Chromium, ptxas for sm_90a, a
# real Slurm): `make test-system` runs those (CI runs it after `make test`).
TEST_JOBS ?= 2
test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile --durations=15 \
	  -m "not system" tests

test-system: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile --durations=15 \
	  -m system tests

clean:
	rm -rf $(VENV) *.egg-info
