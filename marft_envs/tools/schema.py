"""A small JSON-Schema validator for tool arguments (the subset tool schemas use).

``jsonschema`` is not a dependency of marft; tool parameter schemas in the
transformers function-calling convention use a small part of JSON Schema, and
that part is checked here, with messages a model can act on.

Supported keywords: ``type`` (``object``, ``string``, ``integer``, ``number``,
``boolean``, ``array``, ``null``, or a list of them), ``properties``,
``required``, ``additionalProperties`` (``false`` or a schema), ``enum``,
``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``items``,
``minItems``, ``maxItems``. ``description`` and ``title`` are ignored. Any
other keyword in a tool's schema is refused when the tool is built
(:func:`check_schema`), so a schema never promises a check that is not made.
``bool`` is not an ``integer``/``number`` (as in JSON Schema); an integral
float such as ``3.0`` is an ``integer``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["SUPPORTED_KEYWORDS", "SchemaError", "check_schema", "validate"]

#: The JSON-Schema keywords this validator implements.
SUPPORTED_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "enum", "minimum", "maximum",
        "minLength", "maxLength", "items", "minItems", "maxItems", "description", "title", "default",
    }
)
_TYPES = frozenset({"object", "string", "integer", "number", "boolean", "array", "null"})
_MAX_DEPTH = 32  # arguments nested deeper than this are refused, not recursed into


class SchemaError(ValueError):
    """A tool's parameter schema uses something this validator does not implement."""


def check_schema(schema: Any, where: str = "parameters") -> None:
    """Raise :class:`SchemaError` unless ``schema`` uses only :data:`SUPPORTED_KEYWORDS`."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{where}: a schema must be a dict, got {type(schema).__name__}")
    unknown = sorted(set(schema) - SUPPORTED_KEYWORDS)
    if unknown:
        raise SchemaError(f"{where}: unsupported JSON-Schema keywords {unknown}; supported: {sorted(SUPPORTED_KEYWORDS)}")
    types = schema.get("type")
    for t in [types] if isinstance(types, str) else list(types or []):
        if t not in _TYPES:
            raise SchemaError(f"{where}: unknown type {t!r}; known: {sorted(_TYPES)}")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.{name}")
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        check_schema(extra, f"{where}.additionalProperties")
    if "items" in schema:
        check_schema(schema["items"], f"{where}.items")


def _is_type(value: Any, t: str) -> bool:
    if t == "object":
        return isinstance(value, Mapping)
    if t == "array":
        return isinstance(value, (list, tuple))
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if t == "integer":
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    return isinstance(value, (int, float)) and math.isfinite(value)  # number


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def validate(value: Any, schema: Mapping[str, Any], path: str = "arguments", _depth: int = 0) -> list[str]:
    """Every way ``value`` breaks ``schema``, as messages naming the path (``[]``: valid)."""
    if _depth > _MAX_DEPTH:
        return [f"{path}: nested more than {_MAX_DEPTH} levels deep"]
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, t) for t in allowed):
            want = " or ".join(allowed)
            return [f"{path}: expected {want}, got {_type_name(value)} {_short(value)}"]
    if "enum" in schema and value not in list(schema["enum"]):
        errors.append(f"{path}: must be one of {list(schema['enum'])}, got {_short(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: must be <= {schema['maximum']}, got {value}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: must have at most {schema['maxLength']} characters, got {len(value)}")
    if isinstance(value, (list, tuple)):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: must have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: must have at most {schema['maxItems']} items, got {len(value)}")
        elif "items" in schema:
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], f"{path}[{i}]", _depth + 1)
    if isinstance(value, Mapping):
        props = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(f"{path}: missing required argument {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                errors += validate(item, props[name], f"{path}.{name}", _depth + 1)
            elif extra is False:
                errors.append(f"{path}: unexpected argument {str(name)[:40]!r}; expected {sorted(props)}")
            elif isinstance(extra, Mapping):
                errors += validate(item, extra, f"{path}.{name}", _depth + 1)
    return errors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
