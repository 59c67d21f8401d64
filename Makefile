# Two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch (a CUDA build: see README, "GPU").
TORCH ?= torch==2.13.0
# The benchmarks' peers (`make bench-env`, `make bench-dgl-env`): venvs in folders of the
# repository that git ignores, unless set (`make bench-dgl DGL_ENV=/elsewhere`).
PYG_ENV ?= $(CURDIR)/.bench/pyg-env
DGL_ENV ?= $(CURDIR)/.bench/dgl-env
export PYG_ENV DGL_ENV

.PHONY: install demo test bench bench-full bench-suite bench-quick bench-env clean

$(BIN)/pyg-dist: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test]"
	touch $@

install: $(BIN)/pyg-dist

demo: install
	$(BIN)/pyg-dist demo --workdir runs/demo --nproc 4

# Three pytest workers on any machine: most tests wait on processes they started, so a
# third worker fills the waits even on 2 cores (docs/tests.md).
test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 3 --dist worksteal

# The headline table of BENCHMARKS.md from this tree: the quick form of every claim's
# benchmark (~10-15 min on 2 cores), benchmarks/results/headline.json. `bench-full`: the
# long forms (hours). Rows whose peer is missing say which target builds it.
bench: install
	$(BIN)/python benchmarks/headline.py

bench-full: install
	$(BIN)/python benchmarks/headline.py --full

# Every method side by side (BENCHMARKS.md); the PyG loaders need `make bench-env`.
bench-suite: install
	$(BIN)/python -m benchmarks.run_all

bench-quick: install
	$(BIN)/python -m benchmarks.run_all --quick

# torch-scatter/torch-sparse built from source for the PyG baselines (~30 min, once).
bench-env:
	PYG_ENV=$(PYG_ENV) bash benchmarks/bench_env.sh

clean:
	rm -rf $(VENV) runs *.egg-info

# DistDGL side by side: a separate venv (dgl 2.1.0, torch 2.2.1, numpy<2; from PyPI, ~5 GB:
# PyPI's torch 2.2.1 is a CUDA build) in DGL_ENV, then the benchmark (as root: network and
# mount namespaces). `bench-dgl-quick`: a small graph, 2 epochs.
.PHONY: bench-dgl-env bench-dgl bench-dgl-quick

bench-dgl-env:
	DGL_ENV=$(DGL_ENV) bash benchmarks/distdgl_env.sh

bench-dgl: install
	$(BIN)/python benchmarks/distdgl.py --dgl-env $(DGL_ENV)

bench-dgl-quick: install
	$(BIN)/python benchmarks/distdgl.py --dgl-env $(DGL_ENV) --quick

# Full-graph training beside SAR: IntelLabs' SAR at a pinned commit on dgl 2.1.0 / torch 2.2.1
# in its own venv (.bench/sar-env, ignored; SAR_SRC: a git URL or local checkout of SAR), then
# the benchmark and the profile. `bench-sar-quick`: a small graph, 1 and 2 ranks, 2 epochs.
.PHONY: bench-sar-env bench-sar bench-sar-quick
SAR_ENV ?= .bench/sar-env
SAR_SRC ?= https://github.com/IntelLabs/SAR.git

bench-sar-env:
	SAR_ENV=$(SAR_ENV) SAR_SRC=$(SAR_SRC) bash benchmarks/sar_env.sh

bench-sar: install
	$(BIN)/python benchmarks/sar.py --sar-env $(SAR_ENV)

bench-sar-quick: install
	$(BIN)/python benchmarks/sar.py --sar-env $(SAR_ENV) --quick
