"""Search and multi-candidate decoding strategies: one module each, registered on import (docs/search.md)."""

from warpdecode.decoding.search import beam, best_of_n, diverse_beam, first_finish, icn, sample  # noqa: F401
