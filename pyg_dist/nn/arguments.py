r"""Which arguments of a layer's propagate are read at the source and at
the target of an edge (PyG's ``*_j`` / ``*_i`` naming): the source ones
travel as halo rows."""
from typing import List

from torch_geometric.nn.conv import MessagePassing


def source_args(module: MessagePassing, user_args: str = "_user_args") -> List[str]:
    r"""Arguments of propagate (or of the edge updater) that messages read
    at the source (``*_j``), in the order of the message signature: every
    rank exchanges them in the same order (a set's order follows each
    process's string hashing, so two tensors of one shape could be swapped
    between ranks)."""
    return list(dict.fromkeys(arg[:-2] for arg in getattr(module, user_args)
                              if arg.endswith("_j")))


def target_args(module: MessagePassing, user_args: str = "_user_args") -> List[str]:
    r"""Arguments of propagate (or of the edge updater) read at the target
    (``*_i``)."""
    return [arg[:-2] for arg in getattr(module, user_args) if arg.endswith("_i")]
