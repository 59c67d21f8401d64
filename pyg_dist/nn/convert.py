r"""``convert``: the one place where pyg_dist gives a user's modules another
class.

Like :meth:`torch.nn.SyncBatchNorm.convert_sync_batchnorm`, it walks a model
recursively and turns each module it has a class for into that class, with
its state. The new class is always a subclass of the module's own (it adds
or overrides methods, never state), so the module keeps its object: its
parameters, buffers, hooks and ``state_dict`` keys are the same objects,
and an optimizer, a reference the user holds (``model.conv1``) or a
checkpoint made before stay valid. Building a new module and copying the
state, as SyncBatchNorm does, would leave such references on the old one.
"""
from typing import Callable, Optional

import torch

#: ``classes(module)``: the class :obj:`module` should have, or ``None``.
Classes = Callable[[torch.nn.Module], Optional[type]]


def convert(model: torch.nn.Module, classes: Classes) -> torch.nn.Module:
    r"""Gives :obj:`model` and each of its submodules the class
    ``classes(module)`` returns (a subclass of its own; ``None``: keeps
    it), in place; returns :obj:`model`."""
    for module in model.modules():
        cls = classes(module)
        if cls is None or cls is type(module):
            continue
        if not issubclass(cls, type(module)):
            raise TypeError(f"cannot convert a {type(module).__name__} into a "
                            f"{cls.__name__}, which does not extend it")
        module.__class__ = cls
    return model


def exactly(table: dict) -> Classes:
    r"""``classes`` for :func:`convert` from a table of exact classes
    (``{torch.nn.Dropout: Dropout}``: subclasses of a key are kept)."""
    return lambda module: table.get(type(module))
