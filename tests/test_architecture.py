"""The package's one-way flow: partition → DistData → comm → sampler/cache →
nn → loader → train → cli, with no import circle and no private name
crossing a package border (static: every import, module- or function-level)."""
import ast
import os.path as osp
import pkgutil
from typing import Dict, Set

import pytest

import pyg_dist

# Low to high: a module may import its own layer and the layers below.
LAYERS = [
    {"utils", "options", "integrity", "distributed", "version", "reducer", "labels"},
    {"partition", "datasets"},
    {"data"},
    {"comm"},
    {"sampler", "cache"},
    {"nn"},
    {"loader"},
    {"metrics", "config", "checkpoint", "inference", "plots", "run_files"},
    {"train", "launch", "preflight"},
    {"cli", "demo", "notebook"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = osp.dirname(pyg_dist.__file__)


def _modules() -> Dict[str, str]:
    out = {"pyg_dist": osp.join(ROOT, "__init__.py")}
    for info in pkgutil.walk_packages([ROOT], "pyg_dist."):
        path = osp.join(ROOT, *info.name.split(".")[1:])
        out[info.name] = osp.join(path, "__init__.py") if info.ispkg else path + ".py"
    return out


def _imports(path: str):
    r"""``(module, names)`` of every ``pyg_dist`` import in the file."""
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "pyg_dist":
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pyg_dist":
                    yield alias.name, []


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imports(path):
            for sub in names:  # `from pyg_dist.loader import cohesive` imports a module
                if f"{module}.{sub}" in modules:
                    targets.add(f"{module}.{sub}")
            targets.add(module)
        graph[name] = targets
    return graph


def test_every_package_module_has_a_layer():
    missing = {_top(m) for m in _modules() if _top(m) and _top(m) not in LAYER_OF}
    assert not missing, f"add {missing} to LAYERS"


def test_no_upward_import():
    upward = [f"{m} -> {t}" for m, targets in _graph().items() for t in targets
              if _top(m) and (not _top(t) or LAYER_OF[_top(t)] > LAYER_OF[_top(m)])]
    assert not upward, upward


def test_no_import_circle():
    graph = _graph()
    # A package's __init__ re-exports its modules: an edge to the package
    # stands for its __init__, which is a circle only through real modules.
    state: Dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt == node or node.startswith(nxt + "."):  # a module and its own package
                continue
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_the_preflight_needs_no_training_loop():
    r"""The checks before any rank starts read a run's files through
    run_files, not through the training loop (and all it imports)."""
    graph = _graph()
    assert "pyg_dist.train" not in graph["pyg_dist.preflight"]
    assert "pyg_dist.run_files" in graph["pyg_dist.preflight"]


def test_no_private_name_crosses_a_package():
    crossing = []
    for name, path in _modules().items():
        for module, names in _imports(path):
            crossing += [f"{name} imports {module}.{n}" for n in names
                         if n.startswith("_") and not n.startswith("__")
                         and _top(module) != _top(name)]
    assert not crossing, crossing


def _doc_example(name: str):
    r"""The worked example of docs/architecture.md that defines class
    :obj:`name`, executed; returns the class."""
    text = open(osp.join(osp.dirname(ROOT), "docs", "architecture.md")).read()
    blocks = text.split("```python\n")[1:]
    (source, ) = [b.split("```")[0] for b in blocks if f"class {name}" in b]
    namespace: dict = {}
    exec(source, namespace)
    return namespace[name]


def _doc_loader():
    return _doc_example("SplitEpochLoader")


def train_with_doc_loader(root: str, loader: str, steps: int):
    import torch.distributed as dist

    from pyg_dist.config import TrainConfig
    from pyg_dist.loader import LOADERS
    from pyg_dist.train import train
    LOADERS["split"] = _doc_loader()  # the one registry line
    config = TrainConfig(hidden=8, epochs=2, progress=False, loader=loader,
                         loader_args={"steps": steps} if loader == "split" else {})
    summary = train(root, config, None)
    return summary["final_loss"], dist.get_rank()


def test_documented_loader_is_one_file_and_one_registry_line(graph, tmp_path, monkeypatch,
                                                              capsys):
    from pyg_dist.cli import main
    from pyg_dist.loader import LOADERS
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    full = pyg_dist.spawn(train_with_doc_loader, 2, (root, "full", 1))
    split1 = pyg_dist.spawn(train_with_doc_loader, 2, (root, "split", 1))
    split3 = pyg_dist.spawn(train_with_doc_loader, 2, (root, "split", 3))
    assert full[0][0] == split1[0][0]  # one step per epoch: the full-graph loader, exactly
    assert split3[0][0] != full[0][0]
    monkeypatch.setitem(LOADERS, "split", _doc_loader())
    with pytest.raises(SystemExit):  # its flag exists; the combination is refused
        main(["train", "--root", root, "--loader", "split", "--steps", "2",
              "--sampler", "bns"])
    assert "loader 'split' runs on exact plans" in capsys.readouterr().err


def _doc_exchange():
    return _doc_example("CollectiveExchange")


def train_with_doc_exchange(root: str, exchange: str):
    import torch.distributed as dist

    from pyg_dist.comm import EXCHANGES
    from pyg_dist.config import TrainConfig
    from pyg_dist.train import train
    EXCHANGES["a2a"] = _doc_exchange()  # the one registry line
    config = TrainConfig(hidden=8, epochs=2, progress=False, exchange=exchange)
    summary = train(root, config, None)
    return summary["final_loss"], summary["bytes_sent_per_epoch"], dist.get_rank()


def test_documented_exchange_is_one_file_and_one_registry_line(graph, tmp_path, monkeypatch,
                                                                capsys):
    from pyg_dist.cli import main
    from pyg_dist.comm import EXCHANGES
    root = str(tmp_path / "parts")
    pyg_dist.partition_graph(graph, 2, root=root)
    halo = pyg_dist.spawn(train_with_doc_exchange, 2, (root, "halo"))
    a2a = pyg_dist.spawn(train_with_doc_exchange, 2, (root, "a2a"))
    # the same rows arrive: the same run, up to the order autograd adds each
    # row's gradients in (the halo exchange returns them added into one buffer)
    assert a2a[0][0] == pytest.approx(halo[0][0], rel=1e-6)
    assert a2a[0][1] == halo[0][1] > 0  # and it counts the same bytes
    monkeypatch.setitem(EXCHANGES, "a2a", _doc_exchange())
    with pytest.raises(SystemExit):  # its flag value exists; the combination is refused
        main(["train", "--root", root, "--exchange", "a2a", "--sampler", "bns"])
    err = capsys.readouterr().err
    assert "exchange='a2a' moves halo rows with all_to_all_single" in err
    assert "sampler='bns'" in err


def test_no_layer_module_imports_an_exchange_implementation():
    r"""nn/ reaches the exchanges through the context's Exchange only."""
    implementations = {"pyg_dist.comm.halo", "pyg_dist.comm.broadcast",
                       "pyg_dist.comm.sequential", "pyg_dist.comm.ring"}
    found = [f"{m} -> {t}" for m, targets in _graph().items() if m.startswith("pyg_dist.nn")
             for t in targets if t in implementations]
    assert not found, found
