r"""Small helpers every layer of the package may use (they import nothing
of :mod:`pyg_dist`)."""
from pyg_dist.utils.seed import mix_seeds
from pyg_dist.utils.sparse import csr, csr_tensor, distinct, gather_neighbours

__all__ = ["csr", "csr_tensor", "distinct", "gather_neighbours", "mix_seeds"]
