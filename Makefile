# Two commands do all set-up on a fresh machine:
#   make run    the main job on the best device present (GPU if any, else the CPU path with params/cpu.yaml)
#   make test   the test suite (CPU; Triton kernels in Triton's interpreter)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is pinned here, before anything else asks for it: an unpinned torch pulls a multi-GB CUDA build.
# Without a GPU, triton is pinned to the GPU image's 3.6.0 for its interpreter; with one, torch brings its own.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_PINS := torch==2.13.0 $(if $(HAS_GPU),,triton==3.6.0)

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/attnlab run

# Two test processes (pytest-xdist); the sm_90a compiles the tests read run beside them, each once, shared out among
# the processes (tests/offline.py).
TEST_JOBS ?= 2
test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) tests

clean:
	rm -rf $(VENV) *.egg-info
