"""The version of iosim: one place, read by pyproject.toml (dynamic version), the provenance and ``iosim --version``."""

__version__ = "0.1.0"
