"""Search and multi-candidate decoding strategies: one module each, registered on import (docs/search.md)."""

from warpdecode.decoding.search import beam  # noqa: F401
