"""The ``fx`` command: a thin layer composing the commands of the project's packages."""

__all__: list[str] = []
