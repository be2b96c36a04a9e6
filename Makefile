# The two commands of the README: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
NP ?= 4
# The architectures whose kernels the install compiles into the package (ipcshare/kernels/
# cubin, by NVRTC): the ones the tests check, about 70 s on 2 cores. A plain `pip install .`
# ships sm_80, sm_90 and sm_100 (README, "What the install builds").
KERNEL_ARCHS ?= sm_80,sm_90
# pytest under mpiexec: every rank runs the same tests and checks results collectively.
MPI_PYTEST := $(PY) -m pytest -q -p no:cacheprovider --with-mpi -m mpi

.PHONY: demo test test-unit test-mpi soak refused-repeat gpu-check lint clean

$(VENV)/.installed: pyproject.toml setup.py
	@$(PYTHON) -m venv $(VENV) || { echo "make: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; rm -rf $(VENV); exit 1; }
	$(PY) -m pip install -q --upgrade pip
	IPCSHARE_KERNEL_ARCHS=$(KERNEL_ARCHS) $(PY) -m pip install -q -e '.[mpich,test,nvrtc]'
	touch $@

demo: $(VENV)/.installed
	$(MPIEXEC) -n $(NP) $(VENV)/bin/ipcshare ring -b 1K -e 16M -f 4 --baseline mpi

test: test-unit test-mpi

test-unit: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider -m "not mpi and not gpu" tests

test-mpi: $(VENV)/.installed
	for n in 1 2 3 4; do \
	  echo "== mpiexec -n $$n"; \
	  $(MPIEXEC) -n $$n $(MPI_PYTEST) tests/mpi tests/gpu || exit 1; \
	done

# Long run, not part of `make test`: 10,000 windows and 100,000 ring iterations with
# descriptor, mapping and memory counts that must stay flat (docs/RELIABILITY.md).
soak: $(VENV)/.installed
	$(MPIEXEC) -n 2 $(PY) tools/checks/soak.py $(SOAK_ARGS)

# Not part of `make test` either: 50 all-to-all-v calls that one rank refuses, each
# followed by a good one, at 2 and 3 ranks: no hang, no wrong element (docs/RELIABILITY.md).
refused-repeat: $(VENV)/.installed
	for n in 2 3; do \
	  IPCSHARE_SIGNAL_TIMEOUT=10 $(MPIEXEC) -n $$n $(PY) tools/checks/refused_calls_repeat.py $(REPEAT_ARGS) || exit 1; \
	done

# On a GPU node (see docs/GPU.md): GPU tests and a short benchmark, logs under $$OUT;
# PHASES="tests allreduce-quick" picks phases (python3 tools/gpu_check.py --list).
gpu-check:
	python3 tools/gpu_check.py $(PHASES)

lint: $(VENV)/.installed
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check ipcshare tests

clean:
	rm -rf $(VENV) build *.egg-info ipcshare/kernels/cubin
