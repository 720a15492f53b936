"""Search and multi-candidate decoding strategies: one module each, registered on import (docs/search.md)."""

from warpdecode.decoding.search import (  # noqa: F401
    astar,
    beam,
    best_of_n,
    deal,
    diverse_beam,
    edu_plans,
    first_finish,
    icn,
    pg_td,
    rankgen,
    sample,
    superposed,
    transfer_q,
)
