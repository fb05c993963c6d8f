"""The integer engine's small synthetic artifact, for re-executing hostile receipts."""

from tests.unit.integer.conftest import synth_path

__all__ = ["synth_path"]
