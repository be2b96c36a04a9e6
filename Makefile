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
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
# The unit tests run on this many pytest-xdist workers (0: in one process). Many of them
# wait on the jobs they launch, so 2 workers keep 2 cores busy.
UNIT_WORKERS ?= 2
UNIT_PYTEST := $(PYTEST) -n $(UNIT_WORKERS) --dist loadgroup
# pytest under mpiexec: every rank runs the same tests and checks results collectively,
# at each of these world sizes (a test that means nothing at a size skips there).
MPI_PYTEST := $(PYTEST) --with-mpi
MPI_SIZES ?= 1 2 3 4
MPI_TESTS := tests/mpi tests/gpu
# Prints each part's wall time (and appends it to the file TEST_TIMES names, if any).
TIMED := tools/timed.sh

.PHONY: demo test test-unit test-mpi test-slow soak refused-repeat attacks gpu-check lint clean

$(VENV)/.installed: pyproject.toml setup.py
	@$(PYTHON) -m venv $(VENV) || { echo "make: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; rm -rf $(VENV); exit 1; }
	$(PY) -m pip install -q --upgrade pip
	IPCSHARE_KERNEL_ARCHS=$(KERNEL_ARCHS) $(PY) -m pip install -q -e '.[mpich,test,nvrtc]'
	touch $@

demo: $(VENV)/.installed
	$(MPIEXEC) -n $(NP) $(VENV)/bin/ipcshare ring -b 1K -e 16M -f 4 --baseline mpi

# Ends with the wall time of each part (install, unit tests, each MPI world size), so
# that a CI log shows where the time goes.
test:
	@export TEST_TIMES=$$(mktemp); started=$$(date +%s); \
	$(TIMED) install $(MAKE) --no-print-directory $(VENV)/.installed \
	  && $(MAKE) --no-print-directory test-unit test-mpi; status=$$?; \
	echo "== make test: wall time per part"; cat $$TEST_TIMES; rm -f $$TEST_TIMES; \
	echo "total: $$(($$(date +%s) - started)) s"; exit $$status

test-unit: $(VENV)/.installed
	@$(TIMED) unit $(UNIT_PYTEST) -m "not mpi and not gpu and not slow and not serial" tests
	@$(TIMED) "unit serial" $(PYTEST) -m "serial and not mpi and not gpu and not slow" tests

test-mpi: $(VENV)/.installed
	@for n in $(MPI_SIZES); do \
	  echo "== mpiexec -n $$n"; \
	  $(TIMED) "mpi -n $$n" $(MPIEXEC) -n $$n $(MPI_PYTEST) -m "mpi and not slow" $(MPI_TESTS) \
	    || exit 1; \
	done

# Long runs that `make test` leaves out: tests marked slow (the many repetitions of a
# fault, the shipped CPU benchmark suite in full) and the property tests with all the
# examples each asks for (`make test` tries a fifth: tests/hypothesis_profiles.py), then
# the slow MPI tests at 2, 3 and 4 ranks. Exit 5 is pytest's "no test selected": a world
# size where no slow test runs.
test-slow: $(VENV)/.installed
	$(UNIT_PYTEST) --hypothesis-profile thorough -m "(slow or hypothesis) and not mpi and not gpu" \
	  tests
	@for n in 2 3 4; do \
	  echo "== mpiexec -n $$n"; \
	  $(MPIEXEC) -n $$n $(MPI_PYTEST) -m "mpi and slow" $(MPI_TESTS); \
	  status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status; \
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
	IPCSHARE_SIGNAL_TIMEOUT=10 $(MPIEXEC) -n 4 $(PY) tools/checks/refused_calls_repeat.py --nodes 2 $(REPEAT_ARGS)

# Long run, not part of `make test`: the socket attacks and the stopped rank, 20-50 real
# jobs each (docs/RELIABILITY.md, faults 44-47); needs unshare (root or user namespaces).
attacks: $(VENV)/.installed
	$(PY) tools/checks/socket_attacks.py all $(ATTACK_ARGS)

# On a GPU node (see docs/GPU.md): GPU tests and a short benchmark, logs under $$OUT;
# PHASES="tests allreduce-quick" picks phases (python3 tools/gpu_check.py --list).
gpu-check:
	python3 tools/gpu_check.py $(PHASES)

lint: $(VENV)/.installed
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check ipcshare tests

clean:
	rm -rf $(VENV) build *.egg-info ipcshare/kernels/cubin
