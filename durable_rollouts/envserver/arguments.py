"""A template's arguments and answers through pydantic: adapters, JSON schemas and coercion.

Plain annotations (builtins and typing only) share one ``TypeAdapter`` per process, since an env
file loaded per rollout builds its templates again; a file's own classes are new objects on each
load and are never cached. Arguments that arrive as strings are coerced (JSON first); answers are
parsed to the template's answer type when they can be, else passed on as given.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

from ..errors import ConfigError

__all__: list[str] = []  # private to envserver: environment.py uses them


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}  # plain annotations (str, int | None ...) -> adapter


def _adapter(annotation: Any) -> TypeAdapter[Any]:
    """A TypeAdapter, shared for annotations made of builtins and typing only (a file loaded per
    rollout builds its templates again: ``str`` need not be compiled each time; its own classes
    are new objects each load, so they are never cached)."""
    if not _plain(annotation):
        return TypeAdapter(annotation)
    found = _ADAPTERS.get(annotation)
    if found is None:
        found = _ADAPTERS[annotation] = TypeAdapter(annotation)
    return found


def _plain(annotation: Any) -> bool:
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    if getattr(annotation, "__module__", None) not in ("builtins", "typing", "types"):
        return False
    try:
        hash(annotation)
    except TypeError:
        return False
    return all(_plain(arg) if not isinstance(arg, (str, int, float, bool, bytes)) else True
               for arg in typing.get_args(annotation))


class _LenientSchema(GenerateJsonSchema):
    """Describes what it can: a parameter of a type JSON schema cannot express gets ``{}``."""

    def handle_invalid_for_json_schema(self, schema: Any, error_info: str) -> JsonSchemaValue:
        return {}


def _schema(adapter: TypeAdapter[Any]) -> dict[str, Any]:
    try:
        return dict(adapter.json_schema())
    except Exception:  # a type pydantic cannot describe still works, it just has no schema
        return {}


def _coerce(adapter: TypeAdapter[Any], name: str, value: Any) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        first = exc
    if isinstance(value, str):
        try:
            return adapter.validate_python(json.loads(value))
        except (ValueError, ValidationError):
            pass
    detail = first.errors()[0].get("msg", str(first)) if first.errors() else str(first)
    raise ConfigError(f"argument {name!r}: {detail} (got {value!r})")


def _parse_answer(adapter: TypeAdapter[Any], answer: Any) -> Any:
    try:
        return adapter.validate_python(answer)
    except ValidationError:
        pass
    if isinstance(answer, str):
        try:
            return adapter.validate_json(answer)
        except ValidationError:
            pass
    return answer
