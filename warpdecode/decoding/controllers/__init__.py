"""Controllers: one module each, registered on import."""

from warpdecode.decoding.controllers import adaptive, fixed  # noqa: F401
