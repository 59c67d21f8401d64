from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn import GraphConv, SAGEConv
from torch_geometric.typing import Adj, OptPairTensor, OptTensor

from pyg_dist.nn.convert import convert, exactly
from pyg_dist.nn.state import engine_of
from pyg_dist.utils.aggregate import spmm

#: Aggregations that commute with a linear map: :math:`\mathrm{aggr}_j(W
#: x_j) = W\,\mathrm{aggr}_j(x_j)`.
LINEAR_AGGREGATIONS = ("mean", "sum", "add")

def projects_first(layer, lin: torch.nn.Module, x_src: Tensor) -> bool:
    r"""Whether :obj:`layer` aggregates :obj:`lin`'s projection of its
    source rows instead of projecting their aggregate: exact when the
    aggregation is linear, cheaper when fewer columns are aggregated (and
    exchanged) over forward and backward: the projection's width
    :math:`d_{out}` when the rows already need a gradient, else
    :math:`2 d_{out}` (their gradient now travels back too), against the
    rows' :math:`d_{in}`. Distributed, its engine must allow it
    (:meth:`~pyg_dist.nn.engine.Engine.may_project`: not where the rows
    must travel as they are). A layer whose ``project_first`` is ``False``
    always computes PyG's order."""
    weight = lin.weight
    if not layer.project_first or isinstance(weight, UninitializedParameter) \
            or not isinstance(layer.aggr, str) or layer.aggr not in LINEAR_AGGREGATIONS:
        return False
    directions = 1 if x_src.requires_grad or not torch.is_grad_enabled() else 2
    if directions * weight.size(0) >= x_src.size(-1):
        return False
    engine = engine_of(layer)
    return engine is None or engine.may_project(layer, x_src)


def _tell_engine(layer, raw: bool) -> None:
    r"""Tells a distributed layer's engine whether the rows it aggregates
    are its input (``W`` applied after), which samplers read."""
    engine = engine_of(layer)
    if engine is not None:
        engine.exchanges(layer, raw)


def _pair(x: Union[Tensor, Tuple[Tensor, OptTensor]]) -> Tuple[Tensor, OptTensor]:
    return (x, x) if isinstance(x, Tensor) else (x[0], x[1])


class DistSAGEConv(SAGEConv):
    r""":class:`torch_geometric.nn.SAGEConv` that projects before it
    aggregates when that is exact and cheaper (:func:`projects_first`):

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \mathrm{aggr}_{j \in \mathcal{N}(i)} (\mathbf{W}_2 \mathbf{x}_j)
        + \mathbf{b}_2

    which for a mean or sum aggregation equals PyG's
    :math:`\mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2\,\mathrm{aggr}_j
    \mathbf{x}_j + \mathbf{b}_2` (DGL's ``SAGEConv`` does the same): the
    aggregation and, distributed, the halo exchange run on
    :math:`\mathbf{W}_2 \mathbf{x}_j`, narrower than :math:`\mathbf{x}_j`
    when the layer's output is. Otherwise (max, min, ``project=True``, a
    wider output, rows that must travel untransformed) it is PyG's forward.
    """
    #: Set ``False`` on a layer to keep PyG's order everywhere.
    project_first = True

    def forward(self, x: Union[Tensor, Tuple[Tensor, OptTensor]], edge_index: Adj,
                size: Optional[Tuple[int, int]] = None) -> Tensor:
        x_src, x_dst = _pair(x)
        raw = self.project or not projects_first(self, self.lin_l, x_src)
        _tell_engine(self, raw)
        if raw:
            return super().forward(x, edge_index, size)
        out = self.propagate(edge_index, x=(F.linear(x_src, self.lin_l.weight), x_dst),
                             size=size)
        if self.root_weight and x_dst is not None:  # a new buffer no backward reads:
            out = (torch.addmm(out, x_dst, self.lin_r.weight.t()) if self.lin_r.bias is None
                   else out + self.lin_r(x_dst))
            if self.lin_l.bias is not None:  # the bias goes into it
                out = out.add_(self.lin_l.bias)
        elif self.lin_l.bias is not None:
            out = out + self.lin_l.bias
        if self.normalize:
            out = F.normalize(out, p=2., dim=-1)
        return out

    def message_and_aggregate(self, adj_t: Adj, x: OptPairTensor) -> Tensor:
        if isinstance(adj_t, Tensor):  # a torch.sparse adjacency: pyg_dist.utils.aggregate
            return spmm(adj_t, x[0], reduce=self.aggr)
        return super().message_and_aggregate(adj_t, x)


class DistGraphConv(GraphConv):
    r""":class:`torch_geometric.nn.GraphConv` that projects before it
    aggregates when that is exact and cheaper (:func:`projects_first`):

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \mathrm{aggr}_{j \in \mathcal{N}(i)} e_{j,i} (\mathbf{W}_2 \mathbf{x}_j)
        + \mathbf{b}_2

    equal to PyG's for a sum or mean aggregation; PyG's forward otherwise.
    """
    project_first = True

    def forward(self, x: Union[Tensor, Tuple[Tensor, OptTensor]], edge_index: Adj,
                edge_weight: OptTensor = None,
                size: Optional[Tuple[int, int]] = None) -> Tensor:
        x_src, x_dst = _pair(x)
        raw = not projects_first(self, self.lin_rel, x_src)
        _tell_engine(self, raw)
        if raw:
            return super().forward(x, edge_index, edge_weight, size)
        out = self.propagate(edge_index, x=(F.linear(x_src, self.lin_rel.weight), x_dst),
                             edge_weight=edge_weight, size=size)
        if self.lin_rel.bias is not None:
            out = out + self.lin_rel.bias
        if x_dst is not None:
            out = out + self.lin_root(x_dst)
        return out

    def message_and_aggregate(self, edge_index: Adj, x: OptPairTensor,
                              edge_weight: OptTensor) -> Tensor:
        if isinstance(edge_index, Tensor) and edge_index.is_sparse_csr:
            return spmm(edge_index, x[0], reduce=self.aggr)
        return super().message_and_aggregate(edge_index, x, edge_weight)


def project_first(model: torch.nn.Module) -> torch.nn.Module:
    r"""Gives every :class:`~torch_geometric.nn.SAGEConv` and
    :class:`~torch_geometric.nn.GraphConv` of a plain PyG :obj:`model` (one
    trained undistributed, e.g. on the neighbour loader's batches) its
    projecting class, in place (:func:`~pyg_dist.nn.convert.convert`):
    same parameters, ``state_dict`` and results, less work where the
    output is narrower."""
    return convert(model, exactly({SAGEConv: DistSAGEConv, GraphConv: DistGraphConv}))
