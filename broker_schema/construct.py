"""Records built from parsed JSON without validating them: for logs that were validated already.

A lease holder decodes every record it merges strictly (:func:`broker_schema.codec.decode`:
pydantic's validation and the canonical comparison) and writes the merge order only for records
that passed. Replaying such a log again later may skip that work when the caller says it trusts
the log (``replay(..., trust_log=True)``): :func:`construct` builds the same frozen record
objects as ``model_construct`` does (without its per-call field loop), recursively (nested
models, discriminated bodies, tuples), from the parsed JSON.

What it does not check is what validation would: field types, patterns, ranges, extra fields,
the effect id against its header, a body's base64. A field a record kind requires that is
missing, a body whose ``type`` is none of the body kinds, or a value of the wrong shape for a
nested model raises :class:`ConstructError` (a ``ValueError``). The builders are derived once
per model class from its field annotations, so they follow the records as they change; a
property test holds ``construct(parse(encode(r))) == r`` over every record kind.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from pydantic import BaseModel, JsonValue
from pydantic.fields import FieldInfo

__all__ = ["ConstructError", "construct", "construct_values"]

#: Turns a parsed JSON value into a field's value; None where the JSON value is the field's value
#: as it is (strings, numbers, booleans, JSON values, dicts of those).
Convert = Callable[[Any], Any] | None


class ConstructError(ValueError):
    """The parsed JSON does not have the shape of the record kind (a required field missing, a
    body of no known type, a list or object where another is expected)."""


_BUILDERS: dict[type[BaseModel], Callable[[Any], BaseModel]] = {}


def construct(cls: type[BaseModel], obj: Any) -> BaseModel:
    """``cls`` built from the parsed JSON ``obj`` (an object) without validation; see the module
    docstring for what is not checked."""
    return _builder(cls)(obj)


def _builder(cls: type[BaseModel]) -> Callable[[Any], BaseModel]:
    build = _BUILDERS.get(cls)
    if build is not None:
        return build
    # placeholder first, so a model that (indirectly) holds itself does not recurse forever;
    # removed again when no builder can be made (the TypeError is raised on every later call)
    _BUILDERS[cls] = lambda obj: _BUILDERS[cls](obj)
    try:
        _BUILDERS[cls] = _make_builder(cls)
    except BaseException:
        del _BUILDERS[cls]
        raise
    return _BUILDERS[cls]


def _make_builder(cls: type[BaseModel]) -> Callable[[Any], BaseModel]:
    fields = cls.model_fields
    for name, info in fields.items():
        if info.alias not in (None, name) or info.validation_alias not in (None, name):
            raise TypeError(f"{cls.__name__}.{name} has an alias: not built without validation")
    if cls.__pydantic_post_init__ or cls.__pydantic_root_model__ or \
            cls.model_config.get("extra") == "allow":
        raise TypeError(f"{cls.__name__}: not built without validation (post-init, root model "
                        "or extra fields)")
    converted = [(name, conv) for name, info in fields.items()
                 if (conv := _converter(info.annotation)) is not None]
    required = frozenset(name for name, info in fields.items() if info.is_required())
    names = frozenset(fields)
    # defaults of immutable values are shared, as pydantic shares them; others made per record
    constant: dict[str, Any] = {}
    made: list[tuple[str, FieldInfo]] = []
    for name, info in fields.items():
        if info.is_required():
            continue
        if info.default_factory is None and type(info.default) in _IMMUTABLE:
            constant[name] = info.default
        else:
            made.append((name, info))
    new = cls.__new__
    set_attr = object.__setattr__
    # per shape (the object's keys in their order: records of a kind nearly always have one),
    # the checked keys' plan: the immutable defaults to add, the made ones, the converted ones
    plans: dict[tuple[str, ...], tuple[list[tuple[str, Any]], list[tuple[str, FieldInfo]],
                                       list[tuple[str, Callable[[Any], Any]]]]] = {}

    def plan(shape: tuple[str, ...]) -> tuple[list[tuple[str, Any]],
                                              list[tuple[str, FieldInfo]],
                                              list[tuple[str, Callable[[Any], Any]]]]:
        keys = set(shape)
        if not required <= keys or not keys <= names:
            missing = sorted(required - keys)
            raise ConstructError(f"{cls.__name__} has no {missing[0]!r}" if missing else
                                 f"{cls.__name__} has no field {sorted(keys - names)[0][:60]!r}")
        found = ([(name, value) for name, value in constant.items() if name not in keys],
                 [(name, info) for name, info in made if name not in keys],
                 [(name, conv) for name, conv in converted if name in keys])
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[shape] = found
        return found

    def build_model(obj: Any) -> BaseModel:
        if type(obj) is not dict:
            raise ConstructError(f"{cls.__name__} is a JSON object, not {type(obj).__name__}")
        shape = tuple(obj)
        defaults, makes, converts = plans.get(shape) or plan(shape)
        values = dict(obj)
        for name, value in defaults:
            values[name] = value
        for name, info in makes:
            values[name] = info.get_default(call_default_factory=True, validated_data=values)
        for name, conv in converts:
            value = obj[name]
            if value is not None:  # defaults are values already
                values[name] = conv(value)
        m = new(cls)
        set_attr(m, "__dict__", values)
        set_attr(m, "__pydantic_fields_set__", set(shape))
        set_attr(m, "__pydantic_extra__", None)
        set_attr(m, "__pydantic_private__", None)
        return m

    return build_model


_IMMUTABLE = (type(None), str, int, bool, float, tuple, frozenset)
#: Key orders remembered per model class (a bound: a hostile log cannot grow it without end).
_PLANS_MAX = 64


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _converter(tp: Any) -> Convert:
    """The converter of a field annotation (None: the JSON value as it is)."""
    tp = _strip(tp)
    if tp is JsonValue or tp is Any:
        return None
    if _is_model(tp):
        return _builder(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return None
    if origin is Union or origin is types.UnionType:
        options = [_strip(a) for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return _converter(options[0])  # Optional[X]: None is kept before converting
        models = [a for a in options if _is_model(a)]
        if not models:
            if any(_converter(a) is not None for a in options):
                raise TypeError(f"no trusted construction for {tp!r}")
            return None
        if len(models) != len(options):
            raise TypeError(f"no trusted construction for a union of models and values: {tp!r}")
        return _discriminated(models)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            each = _converter(args[0])
            if each is None:
                return _as_tuple
            return lambda v: tuple(each(x) for x in _list(v))
        items = [_converter(a) for a in args]
        return lambda v: tuple(x if c is None else c(x) for c, x in zip(items, _list(v),
                                                                         strict=True))
    if origin is dict:
        value = _converter(typing.get_args(tp)[1])
        if value is None:
            return None
        return lambda v: {k: value(x) for k, x in v.items()}
    if origin is list:
        item = _converter(typing.get_args(tp)[0])
        return None if item is None else (lambda v: [item(x) for x in _list(v)])
    if tp in (str, int, float, bool, type(None)):
        return None
    raise TypeError(f"no trusted construction for {tp!r}")


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise ConstructError(f"a JSON array is expected, not {type(value).__name__}")
    return value


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(_list(value))


def _discriminated(models: list[type[BaseModel]]) -> Callable[[Any], BaseModel]:
    """A union of models told apart by a field every one of them has as a one-value
    ``Literal`` (bodies: ``type``)."""
    field, tags = _tag_field(models)
    builders = {tag: _builder(m) for tag, m in tags.items()}
    names = sorted(map(str, builders))

    def pick(obj: Any) -> BaseModel:
        if type(obj) is not dict:
            raise ConstructError(f"a body is a JSON object, not {type(obj).__name__}")
        build = builders.get(obj.get(field))
        if build is None:
            raise ConstructError(f"{field} {str(obj.get(field))[:60]!r} is not one of {names}")
        return build(obj)

    return pick


def _tag_field(models: list[type[BaseModel]]) -> tuple[str, dict[Any, type[BaseModel]]]:
    """The field that tells ``models`` apart, and each model by its value of it."""
    shared = set.intersection(*(set(m.model_fields) for m in models))
    for field in sorted(shared):
        tags: dict[Any, type[BaseModel]] = {}
        for m in models:
            ann = _strip(m.model_fields[field].annotation)
            args = typing.get_args(ann)
            if typing.get_origin(ann) is not Literal or len(args) != 1 or args[0] in tags:
                break
            tags[args[0]] = m
        else:
            return field, tags
    raise TypeError(f"no discriminating field shared by {[m.__name__ for m in models]}")


#: Per model class: its fields in order, each with its default (``_REQUIRED``: none) and whether
#: the default comes from a factory (made per record); the set of their names; and per shape of
#: the values given (their names in their order), the defaults that go before and after them
#: when the names given are consecutive fields in their order (None: filled field by field).
_FIELDS: dict[type[BaseModel], tuple[tuple[tuple[str, Any, bool], ...], frozenset[str],
                                     dict[tuple[str, ...],
                                          tuple[dict[str, Any], dict[str, Any]] | None]]] = {}
_REQUIRED = object()


def construct_values(cls: type[BaseModel], values: dict[str, Any]) -> BaseModel:
    """``cls`` built from field values that are already what validation makes of them (nested
    records as instances of their classes, tuples as tuples), the fields not given set to their
    defaults, without validation: the same object as ``cls(**values)`` for such values (the
    caller's to know; the fold's own values, bodies of records already decoded). Raises
    :class:`ConstructError` for a required field not given or a field ``cls`` has not."""
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = (tuple(
            (name, _REQUIRED if info.is_required() else
             info.default_factory if info.default_factory is not None else info.default,
             info.default_factory is not None)
            for name, info in cls.model_fields.items()), frozenset(cls.model_fields), {})
    fields, names, shapes = known
    shape = tuple(values)
    if shape in shapes:
        around = shapes[shape]
    else:
        around = _around(cls, fields, names, shape)
        if len(shapes) >= _PLANS_MAX:
            shapes.clear()
        shapes[shape] = around
    if around is not None:  # the fields in their order, as validation sets them
        full = {**around[0], **values, **around[1]}
    else:
        full = {name: values[name] if name in values else default() if factory else default
                for name, default, factory in fields}
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", full)
    object.__setattr__(m, "__pydantic_fields_set__", set(shape))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m


def _around(cls: type[BaseModel], fields: tuple[tuple[str, Any, bool], ...],
            names: frozenset[str], shape: tuple[str, ...]
            ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The immutable defaults before and after the fields ``shape`` names, when those are
    consecutive fields in their order and every other field has an immutable default; None
    when the record is to be filled field by field. :class:`ConstructError` for a required
    field not given or a field ``cls`` has not."""
    given = set(shape)
    if not given <= names:
        raise ConstructError(f"{cls.__name__} has no field {sorted(given - names)[0][:60]!r}")
    for name, default, _factory in fields:
        if name not in given and default is _REQUIRED:
            raise ConstructError(f"{cls.__name__} has no {name!r}")
    order = [name for name, _d, _f in fields]
    at = order.index(shape[0]) if shape else 0
    if tuple(order[at:at + len(shape)]) != shape or any(
            factory or type(default) not in _IMMUTABLE
            for name, default, factory in fields if name not in given):
        return None
    before = {name: default for name, default, _f in fields[:at]}
    after = {name: default for name, default, _f in fields[at + len(shape):]}
    return before, after
