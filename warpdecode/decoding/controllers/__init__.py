"""Controllers: one module each, registered on import."""

from warpdecode.decoding.controllers import fixed  # noqa: F401
