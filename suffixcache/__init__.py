"""suffixcache: suffix trees over token sequences that draft tokens for speculative decoding.

Usable on its own, without the daemon::

    from suffixcache import SuffixCache, Drafter

    cache = SuffixCache()
    cache.add_response("sql", 1, [5, 6, 7, 8])
    cache.open_session("sql", "s1", [1, 2, 5, 6])
    draft = Drafter(cache).propose("sql", "s1", [1, 2, 5, 6])
"""

from suffixcache._native import SuffixTree, speculate_multi
from suffixcache.cache import SuffixCache
from suffixcache.cost import CostProfile
from suffixcache.drafter import (
    EMPTY_DRAFT,
    SOURCES,
    Draft,
    DraftConfig,
    Drafter,
    accepted_length,
    common_prefix_length,
)

__all__ = [
    "EMPTY_DRAFT",
    "SOURCES",
    "CostProfile",
    "Draft",
    "DraftConfig",
    "Drafter",
    "SuffixCache",
    "SuffixTree",
    "accepted_length",
    "common_prefix_length",
    "speculate_multi",
]
