#!/usr/bin/env bash
# Builds the SAR side of benchmarks/sar.py (`make bench-sar-env`): a separate venv in
# $SAR_ENV (default .bench/sar-env, an ignored folder inside the repository) with
# IntelLabs' SAR (Sequential Aggregation and Rematerialization) at a pinned commit on
# DGL 2.1.0 and the torch it was built for, the same stack as benchmarks/distdgl_env.sh:
#   torch==2.2.1, dgl==2.1.0, numpy<2, torchdata==0.7.1 and pandas (`import dgl` imports
#   graphbolt, which imports both), and what SAR imports besides (ifaddr, packaging).
# SAR comes from $SAR_SRC: a git URL or a local checkout (default: its public repository),
# checked out at $SAR_COMMIT (default 6a9a895, the head of its main branch when measured).
# pyg_dist is not installed here: the SAR side only reads the graph files that
# benchmarks/sar.py writes. Prints the install's size and time at the end.
set -euo pipefail

ENV=${SAR_ENV:-.bench/sar-env}
SAR_SRC=${SAR_SRC:-https://github.com/IntelLabs/SAR.git}
SAR_COMMIT=${SAR_COMMIT:-6a9a895}
PYTHON=${PYTHON:-python3}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
start=$(date +%s)

# 1-2. The DGL 2.1 / torch 2.2.1 stack, built as the DistDGL benchmark's, with what SAR
#      imports besides.
mkdir -p "$ENV"
ENV=$(cd "$ENV" && pwd)
DGL_ENV="$ENV" DGL_EXTRA_PACKAGES="ifaddr packaging" PYTHON="$PYTHON" \
  TORCH_CPU_INDEX="$TORCH_CPU_INDEX" bash "$(dirname "$0")/distdgl_env.sh"
# pip install, without the lines about local index folders that lack a package.
pip_install() {
  "$ENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
}

# 3. SAR at the pinned commit, into the venv's own source folder.
src="$ENV/src/SAR"
rm -rf "$src"
git clone -q "$SAR_SRC" "$src"
git -C "$src" checkout -q "$SAR_COMMIT"
echo "SAR $(git -C "$src" rev-parse --short HEAD) from $SAR_SRC"

# 4. The one patch: GraphShardManager.get_full_partition_graph (SAR's one-shot mode, which
#    gathers every remote feature a layer needs at once instead of shard by shard) starts
#    with an unconditional `raise NotImplementedError(... HeteroGraphShardManager)` above
#    its intact body: the raise came with upstream's heterogeneous-graph rewrite of
#    GraphShardManager (e7d4ba3), which left the one-shot body untouched. Delete that one
#    line so that the homogeneous graph this benchmark uses reaches the body (sar.py checks
#    the one-shot loss against the sequential mode's). The build fails if the line moved.
shard_py="$src/sar/core/graphshard.py"
pattern='raise NotImplementedError("get_full_partition_graph function is not adjusted'
[ "$(grep -cF "$pattern" "$shard_py")" = 1 ] \
  || { echo "sar_env.sh: the one-shot patch no longer applies to $shard_py" >&2; exit 1; }
grep -vF "$pattern" "$shard_py" > "$shard_py.patched"
mv "$shard_py.patched" "$shard_py"
echo "patched: removed the NotImplementedError guard of get_full_partition_graph"
pip_install --no-deps "$src"

# 5. Verify: the versions, and that SAR and DGL import on this CPU.
DGLBACKEND=pytorch "$ENV/bin/python" - <<'PY'
import numpy, torch, dgl, sar  # noqa: F401
import dgl.nn.pytorch  # noqa: F401
import inspect
from sar.core.graphshard import GraphShardManager
assert "NotImplementedError" not in inspect.getsource(GraphShardManager.get_full_partition_graph)
assert torch.__version__.split("+")[0] == "2.2.1", torch.__version__
assert dgl.__version__ == "2.1.0", dgl.__version__
assert int(numpy.__version__.split(".")[0]) < 2, numpy.__version__
print(f"sar | dgl {dgl.__version__} | torch {torch.__version__} | numpy {numpy.__version__}")
PY
end=$(date +%s)
echo "SAR venv: $ENV, $(du -sh "$ENV" | cut -f1), built in $((end - start)) s"
