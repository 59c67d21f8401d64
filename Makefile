# Two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch (a CUDA build: see README, "GPU").
TORCH ?= torch==2.13.0

.PHONY: install demo test bench bench-suite bench-quick bench-env clean

$(BIN)/pyg-dist: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test]"
	touch $@

install: $(BIN)/pyg-dist

demo: install
	$(BIN)/pyg-dist demo --workdir runs/demo --nproc 4

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: install
	$(BIN)/python benchmarks/overhead.py

# Every method side by side (BENCHMARKS.md); the PyG loaders need `make bench-env`.
bench-suite: install
	$(BIN)/python -m benchmarks.run_all

bench-quick: install
	$(BIN)/python -m benchmarks.run_all --quick

# torch-scatter/torch-sparse built from source for the PyG baselines (~30 min, once).
bench-env:
	bash benchmarks/bench_env.sh

clean:
	rm -rf $(VENV) runs *.egg-info
