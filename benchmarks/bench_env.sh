#!/usr/bin/env bash
# Builds the benchmark environment for the PyG baselines (ClusterLoader, NeighborLoader)
# from scratch, in $PYG_ENV (default .bench/pyg-env in the repository, ignored by git;
# `make bench-env`), the sources unpacked in $SRC (default .bench/pyg-src):
# torch 2.13.0 (CPU) + torch_geometric + torch_scatter + torch_sparse (with METIS).
# Nothing is installed into the test venv (.venv); pyg_dist is installed editable.
# Compiles run under `nice -n 19` with MAX_JOBS=1 (2-core machine, shared).
set -euo pipefail

MAIN=${MAIN:-$(cd "$(dirname "$0")/.." && pwd)}
ENV=${PYG_ENV:-$MAIN/.bench/pyg-env}
SRC=${SRC:-$MAIN/.bench/pyg-src}
PIP="$ENV/bin/pip"

# 0. System METIS (Debian libmetis-dev 5.1.0: 32-bit idx_t) for torch_sparse WITH_METIS=1
if [ ! -f /usr/include/metis.h ]; then
  apt-get update -qq
  apt-get install -y -qq libmetis-dev
fi

# 1. venv + pinned CPU torch (never unpinned torch: that pulls a CUDA build)
python3 -m venv --clear "$ENV"
"$PIP" install -q torch==2.13.0
"$PIP" install -q torch-geometric numpy pymetis ogb tqdm matplotlib setuptools wheel ninja
"$PIP" install -q -e "$MAIN" --no-deps

# 2. sdists of torch-scatter / torch-sparse (no wheels for torch 2.13 on the registry)
rm -rf "$SRC" && mkdir -p "$SRC" && cd "$SRC"
# (their metadata step imports torch: no build isolation, so it sees $ENV's)
"$PIP" download -q --no-binary :all: --no-deps --no-build-isolation \
  torch-scatter==2.1.2 torch-sparse==0.6.18
tar xzf torch_scatter-2.1.2.tar.gz
tar xzf torch_sparse-0.6.18.tar.gz

# 3. Patch torch_sparse: its metis_cpu.cpp passes int64_t* to METIS, which only
#    compiles against a 64-bit-idx_t METIS. Convert to METIS' idx_t instead
#    (works with Debian's 32-bit libmetis and with a 64-bit build).
patch -p1 -d torch_sparse-0.6.18 <<'PATCH'
--- a/csrc/cpu/metis_cpu.cpp
+++ b/csrc/cpu/metis_cpu.cpp
@@ -30,31 +30,42 @@
     CHECK_INPUT(optional_node_weight.value().numel() == rowptr.numel() - 1);
   }
 
-  int64_t nvtxs = rowptr.numel() - 1;
-  int64_t ncon = 1;
-  auto *xadj = rowptr.data_ptr<int64_t>();
-  auto *adjncy = col.data_ptr<int64_t>();
-
-  int64_t *adjwgt = NULL;
-  if (optional_value.has_value())
-    adjwgt = optional_value.value().data_ptr<int64_t>();
-
-  int64_t *vwgt = NULL;
-  if (optional_node_weight.has_value())
-    vwgt = optional_node_weight.value().data_ptr<int64_t>();
-
-  int64_t objval = -1;
-  auto part = torch::empty({nvtxs}, rowptr.options());
-  auto part_data = part.data_ptr<int64_t>();
+  // System METIS may use 32-bit idx_t: convert inputs to idx_t tensors.
+  auto idx_dtype = sizeof(idx_t) == 8 ? torch::kLong : torch::kInt;
+  auto rowptr_i = rowptr.to(idx_dtype).contiguous();
+  auto col_i = col.to(idx_dtype).contiguous();
+  idx_t nvtxs = rowptr.numel() - 1;
+  idx_t ncon = 1;
+  idx_t nparts = (idx_t)num_parts;
+  auto *xadj = rowptr_i.data_ptr<idx_t>();
+  auto *adjncy = col_i.data_ptr<idx_t>();
+
+  torch::Tensor value_i, node_weight_i;
+  idx_t *adjwgt = NULL;
+  if (optional_value.has_value()) {
+    value_i = optional_value.value().to(idx_dtype).contiguous();
+    adjwgt = value_i.data_ptr<idx_t>();
+  }
+
+  idx_t *vwgt = NULL;
+  if (optional_node_weight.has_value()) {
+    node_weight_i = optional_node_weight.value().to(idx_dtype).contiguous();
+    vwgt = node_weight_i.data_ptr<idx_t>();
+  }
+
+  idx_t objval = -1;
+  auto part_i = torch::empty({(int64_t)nvtxs}, rowptr_i.options());
+  auto part_data = part_i.data_ptr<idx_t>();
 
   if (recursive) {
     METIS_PartGraphRecursive(&nvtxs, &ncon, xadj, adjncy, vwgt, NULL, adjwgt,
-                             &num_parts, NULL, NULL, NULL, &objval, part_data);
+                             &nparts, NULL, NULL, NULL, &objval, part_data);
   } else {
     METIS_PartGraphKway(&nvtxs, &ncon, xadj, adjncy, vwgt, NULL, adjwgt,
-                        &num_parts, NULL, NULL, NULL, &objval, part_data);
+                        &nparts, NULL, NULL, NULL, &objval, part_data);
   }
 
+  auto part = part_i.to(torch::kLong);
   return part;
 #else
   AT_ERROR("Not compiled with METIS support");
PATCH

# 4. Compile (CPU only, low priority, one job). ~7.5 min (scatter) + ~21.5 min (sparse) on 2 cores.
(cd torch_scatter-2.1.2 && nice -n 19 env MAX_JOBS=1 FORCE_ONLY_CPU=1 \
   "$PIP" install --no-build-isolation --no-deps .)
(cd torch_sparse-0.6.18 && nice -n 19 env MAX_JOBS=1 FORCE_ONLY_CPU=1 WITH_METIS=1 \
   "$PIP" install --no-build-isolation --no-deps .)

# 5. Verify: ClusterData/ClusterLoader (METIS via torch_sparse) + NeighborLoader on CPU
cat > "$ENV/verify_bench_env.py" <<'PY'
import time, torch, torch_scatter, torch_sparse, torch_geometric
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected
from torch_geometric.loader import ClusterData, ClusterLoader, NeighborLoader
import tempfile

print("torch", torch.__version__, "| torch_scatter", torch_scatter.__version__,
      "| torch_sparse", torch_sparse.__version__, "| torch_geometric", torch_geometric.__version__)
torch.manual_seed(0)
N, E = 2000, 20000
# METIS (any build, pymetis included) needs an undirected graph: a directed random
# edge_index segfaults or hangs inside METIS, so the 20000 random edges are symmetrised.
edge_index = to_undirected(torch.randint(0, N, (2, E)), num_nodes=N)
data = Data(x=torch.randn(N, 16), edge_index=edge_index, num_nodes=N)
print('graph: nodes', N, 'edges (undirected, both directions)', edge_index.size(1))
with tempfile.TemporaryDirectory() as d:
    t = time.time()
    cd = ClusterData(data, num_parts=10, save_dir=d)
    parts = cd.partition.partptr.diff().tolist()
    loader = ClusterLoader(cd, batch_size=2, shuffle=True)
    nb, nn_ = 0, 0
    for b in loader:
        nb += 1; nn_ += b.num_nodes
    print(f"ClusterData parts sizes={parts}; ClusterLoader batches={nb} nodes={nn_} ({time.time()-t:.2f}s)")
t = time.time()
loader = NeighborLoader(data, num_neighbors=[5, 5], batch_size=128, shuffle=True)
nb = sum(1 for _ in loader)
print(f"NeighborLoader batches={nb} ({time.time()-t:.2f}s)")
PY
cd "$SRC" && "$ENV/bin/python" "$ENV/verify_bench_env.py"
