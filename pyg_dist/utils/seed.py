r"""Seeds derived from integers, so that every draw is a function of
(seed, epoch, iteration, rank, ...) and never of timing or call order."""

_MASK64 = (1 << 64) - 1


def mix_seeds(*values: int) -> int:
    r"""A 63-bit hash of integers (SplitMix64 finaliser per value)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (v & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)
