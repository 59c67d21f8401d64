r"""Names and modules that moved: the old ones keep working for one release
and warn (:class:`DeprecationWarning`, message starting ``pyg_dist:``)."""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Callable, Dict, Tuple

# old module -> new module
MOVED_MODULES = {
    "pyg_dist.loader.cost": "pyg_dist.loader.cohesive.cost",
    "pyg_dist.loader.batch_partition": "pyg_dist.loader.cohesive.batch_partition",
    "pyg_dist.loader.batch_plan": "pyg_dist.loader.cohesive.batch_plan",
    "pyg_dist.loader.balance": "pyg_dist.loader.cohesive.balance",
    "pyg_dist.loader.neighbor_loader": "pyg_dist.loader.neighbor.loader",
    "pyg_dist.loader.neighbor_sampler": "pyg_dist.loader.neighbor.sampler",
    "pyg_dist.loader.feature_store": "pyg_dist.loader.neighbor.feature_store",
    "pyg_dist.loader.pipeline": "pyg_dist.loader.neighbor.pipeline",
    "pyg_dist.sampler.prefetch": "pyg_dist.loader.full",
}


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"pyg_dist: {old} is deprecated and will be removed in the next release; "
                  f"use {new}", DeprecationWarning, stacklevel=stacklevel)


def renamed(module: str, names: Dict[str, Tuple[str, str]]) -> Callable[[str], object]:
    r"""A module-level ``__getattr__`` for :obj:`module` that resolves each
    old name of :obj:`names` to ``(new module, new name)``, with a warning."""
    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module '{module}' has no attribute '{name}'")
        where, new = names[name]
        warn_moved(f"{module}.{name}", f"{where}.{new}")
        return getattr(importlib.import_module(where), new)
    return __getattr__


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    r"""Imports an old module path of :data:`MOVED_MODULES` as a copy of the
    new module's namespace (the same objects), with a warning."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # a fresh module, filled by exec_module

    def exec_module(self, module) -> None:
        new = MOVED_MODULES[module.__name__]
        warn_moved(module.__name__, new, stacklevel=7)
        target = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in vars(target).items()
                                if not k.startswith("__")})


def install() -> None:
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
