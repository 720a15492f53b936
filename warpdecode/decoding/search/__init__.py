"""Search and multi-candidate decoding strategies: one module each, registered on import (docs/search.md)."""

from warpdecode.decoding.search import astar, beam, best_of_n, diverse_beam, first_finish, pg_td, sample  # noqa: F401
