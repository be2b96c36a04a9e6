# The two commands of the README: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
NP ?= 4
# pytest under mpiexec: every rank runs the same tests and checks results collectively.
MPI_PYTEST := $(PY) -m pytest -q -p no:cacheprovider --with-mpi -m mpi

.PHONY: demo test test-unit test-mpi soak attacks gpu-check lint clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) || { echo "make: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; rm -rf $(VENV); exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,test,nvrtc]'
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
	$(MPIEXEC) -n 2 $(PY) tools/soak.py $(SOAK_ARGS)

# Long run, not part of `make test`: the socket attacks and the stopped rank, 20-50 real
# jobs each (docs/RELIABILITY.md, faults 44-47); needs unshare (root or user namespaces).
attacks: $(VENV)/.installed
	$(PY) tools/socket_attacks.py all $(ATTACK_ARGS)

# On a GPU node (see docs/GPU.md): GPU tests and a short benchmark, logs under $$OUT.
gpu-check:
	bash tools/gpu-check.sh

lint: $(VENV)/.installed
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check ipcshare tests

clean:
	rm -rf $(VENV) build *.egg-info
