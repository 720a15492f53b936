"""Controllers: one module each, registered on import."""

from warpdecode.decoding.controllers import adaptive, cost, fixed  # noqa: F401
