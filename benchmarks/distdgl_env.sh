#!/usr/bin/env bash
# Builds the DistDGL side of benchmarks/distdgl.py (`make bench-dgl-env`): a separate
# venv in $DGL_ENV (default .bench/dgl-env in the repository, ignored by git, like
# bench-env's .bench/pyg-env) with DGL 2.1.0 and the torch it was built for, from PyPI only:
#   dgl==2.1.0, torch==2.2.1, numpy<2, torchdata==0.7.1 and pandas (`import dgl` imports
#   dgl.distributed, which imports graphbolt, which imports both), and the rest of what
#   DGL imports (scipy, networkx, requests, tqdm, psutil, pydantic, pyyaml). DGL ships
#   its own METIS (not used: the benchmark gives DGL pyg_dist's METIS assignment).
# torch 2.2.1: the CPU build from download.pytorch.org when that index answers, else
# PyPI's build for linux x86_64 (a CUDA build with ~2.7 GB of nvidia-* wheels; it runs
# on CPU). Nothing is installed into the project venv (.venv), and pyg_dist is not
# installed here: the DGL side only reads the graph files benchmarks/distdgl.py writes.
# $DGL_EXTRA_PACKAGES: more packages resolved with the stack (benchmarks/sar_env.sh builds
# SAR's venv on this one). Prints the install's size and time at the end.
set -euo pipefail

ENV=${DGL_ENV:-$(cd "$(dirname "$0")/.." && pwd)/.bench/dgl-env}
PYTHON=${PYTHON:-python3}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
start=$(date +%s)

"$PYTHON" -m venv --clear "$ENV"
# pip install, without the lines about local index folders that lack a package.
pip_install() {
  "$ENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
}
pip_install --upgrade pip

# 1. torch 2.2.1, CPU build first (no nvidia-* dependencies), PyPI's otherwise.
if timeout 20 "$ENV/bin/python" - "$TORCH_CPU_INDEX" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=15)
PY
  echo "torch 2.2.1: CPU build from $TORCH_CPU_INDEX"
  pip_install torch==2.2.1 "numpy<2" --index-url "$TORCH_CPU_INDEX" \
    --extra-index-url https://pypi.org/simple
else
  echo "torch 2.2.1: $TORCH_CPU_INDEX unreachable: PyPI's build (CUDA libraries, runs on CPU)"
  pip_install torch==2.2.1 "numpy<2"
fi

# 2. DGL and its dependencies, resolved together with the pinned torch and numpy<2
#    (so that nothing replaces them). torchdata 0.7.1: the datapipes graphbolt uses.
# shellcheck disable=SC2086  # the extra packages are words
pip_install dgl==2.1.0 "torch==2.2.1" "numpy<2" torchdata==0.7.1 pandas scipy networkx \
  requests urllib3 tqdm psutil pydantic pyyaml ${DGL_EXTRA_PACKAGES:-}

# 3. Verify: the versions, and that dgl.distributed imports on this CPU.
DGLBACKEND=pytorch "$ENV/bin/python" - <<'PY'
import numpy, torch, dgl, dgl.distributed  # noqa: F401
import dgl.nn.pytorch  # noqa: F401
assert torch.__version__.split("+")[0] == "2.2.1", torch.__version__
assert dgl.__version__ == "2.1.0", dgl.__version__
assert int(numpy.__version__.split(".")[0]) < 2, numpy.__version__
print(f"dgl {dgl.__version__} | torch {torch.__version__} | numpy {numpy.__version__} "
      f"| cuda available: {torch.cuda.is_available()}")
PY
end=$(date +%s)
echo "DGL venv: $ENV, $(du -sh "$ENV" | cut -f1), built in $((end - start)) s"
