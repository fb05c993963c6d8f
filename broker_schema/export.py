"""JSON Schema for every record kind (pure: returns documents; ``fx schema export`` writes them)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from broker_schema.codec import RECORD_ADAPTER
from broker_schema.records import RECORD_TYPES


def json_schemas() -> dict[str, dict[str, Any]]:
    """``{file name: JSON Schema}``: one per record kind plus ``record.schema.json`` (the union)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, model in sorted(RECORD_TYPES.items()):
        schema = TypeAdapter(model).json_schema(mode="serialization")
        schema["$id"] = f"https://ninelives.dev/fx/schema/{kind}.schema.json"
        out[f"{kind}.schema.json"] = schema
    union = RECORD_ADAPTER.json_schema(mode="serialization")
    union["$id"] = "https://ninelives.dev/fx/schema/record.schema.json"
    out["record.schema.json"] = union
    return out
