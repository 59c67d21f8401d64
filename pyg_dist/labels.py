r"""Node labels, checked where they enter a partitioning, so that training
never meets a label it cannot use.

A graph's labels are class ids (``[N]``, integers) or a multi-hot matrix
(``[N, C]`` of 0 and 1, multi-label). The nodes of the train, validation
and test masks must hold a class id in :math:`[0, C)`; nodes outside every
mask may hold anything (OGB marks its unlabelled nodes ``-1``). The number
of classes :math:`C` is declared (``num_classes``) or the largest class id
plus one; an undeclared label space of which most ids have no node (one
outlier label of 1000 among classes 0 to 9 would train a 1001-class model)
is refused, not guessed.
"""
from typing import Mapping, Optional, Union

import numpy as np
import torch

Array = Union[np.ndarray, torch.Tensor]
LABELLED = ("train_mask", "val_mask", "test_mask")


class LabelError(ValueError):
    r"""Labels that training could not use, named with their source."""


def label_classes(y: Array, masks: Mapping[str, Array], source: str,
                  num_classes: Optional[int] = None) -> int:
    r"""The number of classes of the labels :obj:`y`, whose labelled nodes
    are those of :obj:`masks` (all nodes where there is none); raises
    :class:`LabelError` naming :obj:`source` for labels of a float dtype,
    a negative or out-of-range class id on a labelled node, a multi-hot
    matrix that is not 0/1, or an undeclared label space of which most
    class ids have no node."""
    y = _numpy(y)
    if num_classes is not None and num_classes < 1:
        raise LabelError(f"the number of classes must be >= 1 (got {num_classes})")
    given = {k: _numpy(m).astype(bool, copy=False) for k, m in masks.items() if m is not None}
    labelled = y if not given else y[np.logical_or.reduce(list(given.values()))]
    if y.ndim == 2:  # multi-hot
        if num_classes is not None and num_classes != y.shape[1]:
            raise LabelError(f"{source}: a multi-label matrix of {y.shape[1]} columns, but "
                             f"{num_classes} classes are declared")
        if not np.isin(labelled, (0, 1)).all():
            raise LabelError(f"{source}: a multi-label [N, {y.shape[1]}] matrix must hold 0 "
                             f"and 1 only on labelled nodes (class ids go in an [N] vector)")
        return int(y.shape[1])
    if y.ndim != 1:
        raise LabelError(f"{source}: labels of shape {tuple(y.shape)}; expected [N] class "
                         f"ids or an [N, C] multi-hot matrix")
    if y.dtype.kind not in "iu":
        raise LabelError(f"{source}: labels of dtype {y.dtype}, not integer class ids (a "
                         f"multi-label graph gives an [N, C] matrix of 0 and 1)")
    if labelled.size == 0:
        return num_classes or 0
    low, high = int(labelled.min()), int(labelled.max())
    if low < 0:
        where = next((k for k, m in given.items() if (y[m] < 0).any()), "labelled")
        raise LabelError(f"{source}: a node of {where} has label {low}: class ids must be "
                         f">= 0 (nodes in no mask may be unlabelled, e.g. -1)")
    if num_classes is not None:
        if high >= num_classes:
            raise LabelError(f"{source}: label {high} on a labelled node, but {num_classes} "
                             f"classes are declared (ids 0 to {num_classes - 1})")
        return num_classes
    used = np.unique(labelled).size
    if high + 1 > 2 * used:
        raise LabelError(f"{source}: {used} distinct labels reach {high}: {high + 1 - used} of "
                         f"the class ids 0 to {high} have no labelled node (an outlier "
                         f"label?); declare the classes (--num-classes) to train a "
                         f"{high + 1}-class model")
    return high + 1


def _numpy(a: Array) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
