"""The policy format, declared once: every key's type, bounds, default and meaning.

A mapping of a policy document (the top level, a node kind, ``limits``, a switch case's
``when`` ...) is a :class:`Struct` of :class:`Key` entries. From these one declaration come:

- the parser: :meth:`Struct.read` validates a mapping and returns its values, raising
  :class:`~orchestrator.runtime.errors.PolicyError` with the key's location
  (``root.steps[1].stages[0].model: required key is missing``);
- the JSON Schema (:meth:`Type.json`; ``policy_docs.json_schema``, published as
  ``docs/policy.schema.json``) that editors use to validate and complete ``policy.yaml``;
- the reference table (:meth:`Type.text`; ``policy_docs.markdown``, ``docs/reference/policy.md``).

Both files are generated (``python -m orchestrator.runtime.routing.policy_docs``) and tests check
that the committed ones are current. Defaults are not written here: a key's default is the
default of the dataclass field it fills (``Limits.max_text_bytes``,
``ChunkNode.aggregation``), a field whose default is :data:`REQUIRED` makes its key
required, and a key with ``computed`` gets its value from the kind's build step (the text
says how: "the policy's max_sequence_length").

What the schema cannot say, the parser checks after reading (rules across keys or across
the tree: unique names, a ``stride`` below its ``window``, ``param`` values declared in
``request_parameters``, steps that can never run, a ``switch`` without default outside a
``sequence``). This module imports nothing but the standard library and ``errors``: it runs
inside Triton's stub.
"""

from __future__ import annotations

import copy
import math
from dataclasses import MISSING, dataclass, fields, is_dataclass
from dataclasses import replace as _replace
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from orchestrator.runtime.errors import PolicyError

__all__ = [
    "REQUIRED", "check_required", "Type", "Int", "Number", "Bool", "Str", "Choice", "Const", "AnyOf", "Probabilities",
    "Strings", "Params", "NodeRef", "Nodes", "ListOf", "TrueOr", "Struct", "Key", "key_json", "json_text",
]


class _Required:
    """The type of :data:`REQUIRED`."""

    def __repr__(self) -> str:
        return "REQUIRED"

    def __deepcopy__(self, memo: Dict[int, Any]) -> "_Required":
        return self


#: Default of a dataclass field whose policy key must be given (Python 3.9 dataclasses
#: cannot have fields without a default after the base class's defaulted ones).
REQUIRED: Any = _Required()


def check_required(obj: Any) -> None:
    """Raise TypeError when a field of dataclass ``obj`` still holds :data:`REQUIRED`
    (called from ``Node.__post_init__``, so a node built in code must be complete too)."""
    missing = [f.name for f in fields(obj) if getattr(obj, f.name) is REQUIRED]
    if missing:
        raise TypeError(f"{type(obj).__name__}: required field(s) missing: {', '.join(missing)}")


def _type_name(value: Any) -> str:
    return type(value).__name__


# ----------------------------------------------------------------------------- value types


class Type:
    """One kind of value: how it is read, how it is written in JSON Schema and in words.

    Attributes:
        has_nodes: values of this type contain policy nodes (not allowed in ``defaults``).
    """

    has_nodes = False

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        """The validated value (``ctx``: the node parser's context, for node types).

        Raises:
            PolicyError: naming ``where``.
        """
        raise NotImplementedError

    def json(self) -> Dict[str, Any]:
        """This type as JSON Schema (draft-07)."""
        raise NotImplementedError

    def text(self) -> str:
        """This type in words, for ``docs/reference/policy.md``."""
        raise NotImplementedError

    def structs(self) -> Iterator["Struct"]:
        """Mappings nested in this type (documented in their own table)."""
        return iter(())


def _bounds(low: Any, high: Any) -> str:
    return f"[{low}, {high}]"


class Int(Type):
    """An integer (not a bool) in ``[low, high]``."""

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def read(self, value: Any, where: str, ctx: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(f"{where}: expected an integer, got {value!r}")
        if not self.low <= value <= self.high:
            raise PolicyError(f"{where}: {value!r} is outside {_bounds(self.low, self.high)}")
        return int(value)

    def json(self) -> Dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}

    def text(self) -> str:
        return f"integer in {_bounds(self.low, self.high)}"


class Number(Type):
    """A finite number (int or float, not a bool), read as float: in ``[low, high]``, or
    ``> above`` (and at most ``high``) when ``above`` is given."""

    def __init__(self, low: Optional[float] = None, high: Optional[float] = None, above: Optional[float] = None):
        self.low, self.high, self.above = low, high, above

    def read(self, value: Any, where: str, ctx: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PolicyError(f"{where}: expected a finite number, got {value!r}")
        value = float(value)
        if self.above is not None and value <= self.above:
            raise PolicyError(f"{where}: must be > {self.above:g}, got {value}")
        low = self.low if self.low is not None else self.above
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise PolicyError(f"{where}: {value!r} is outside {_bounds(low, self.high)}")
        return float(value)

    def json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": "number"}
        if self.low is not None:
            out["minimum"] = self.low
        if self.above is not None:
            out["exclusiveMinimum"] = self.above
        if self.high is not None:
            out["maximum"] = self.high
        return out

    def text(self) -> str:
        if self.above is not None:
            return f"number > {self.above:g}" + (f", at most {self.high:g}" if self.high is not None else "")
        if self.low is None and self.high is None:
            return "number"
        return f"number in [{self.low:g}, {self.high:g}]"


class Bool(Type):
    """``true`` or ``false``."""

    def read(self, value: Any, where: str, ctx: Any) -> bool:
        if not isinstance(value, bool):
            raise PolicyError(f"{where}: expected true or false, got {value!r}")
        return value

    def json(self) -> Dict[str, Any]:
        return {"type": "boolean"}

    def text(self) -> str:
        return "boolean"


class Str(Type):
    """A string, non-empty unless ``empty`` is True."""

    def __init__(self, empty: bool = False):
        self.empty = empty

    def read(self, value: Any, where: str, ctx: Any) -> str:
        if not isinstance(value, str) or (not value and not self.empty):
            raise PolicyError(f"{where}: expected a {'' if self.empty else 'non-empty '}string, got {value!r}")
        return value

    def json(self) -> Dict[str, Any]:
        return {"type": "string"} if self.empty else {"type": "string", "minLength": 1}

    def text(self) -> str:
        return "string" if self.empty else "non-empty string"


class Choice(Type):
    """One of ``options`` (strings)."""

    def __init__(self, options: Sequence[str]):
        self.options = tuple(options)

    def read(self, value: Any, where: str, ctx: Any) -> str:
        value = Str().read(value, where, ctx)
        if value not in self.options:
            raise PolicyError(f"{where}: {value!r}, expected one of {', '.join(self.options)}")
        return str(value)

    def json(self) -> Dict[str, Any]:
        return {"type": "string", "enum": list(self.options)}

    def text(self) -> str:
        return "one of " + ", ".join(f"`{o}`" for o in self.options)


class Const(Type):
    """A value of ``base`` that must equal ``value``; ``message`` (formatted with
    ``{value}``, the value given) says why another one is refused."""

    def __init__(self, base: Type, value: Any, message: str):
        self.base, self.value, self.message = base, value, message

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        value = self.base.read(value, where, ctx)
        if value != self.value:
            raise PolicyError(f"{where}: {self.message.format(value=value)}")
        return value

    def json(self) -> Dict[str, Any]:
        return {**self.base.json(), "const": self.value}

    def text(self) -> str:
        return f"`{json_text(self.value)}` (the only value)"


class AnyOf(Type):
    """The first of ``types`` that reads the value; when none does, the last one's error."""

    def __init__(self, *types: Type):
        self.types = types

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        for t in self.types[:-1]:
            try:
                return t.read(value, where, ctx)
            except PolicyError:
                pass
        return self.types[-1].read(value, where, ctx)

    def json(self) -> Dict[str, Any]:
        return {"anyOf": [t.json() for t in self.types]}

    def text(self) -> str:
        return " or ".join(t.text() for t in self.types)


class Probabilities(Type):
    """A number in ``[low, high]`` for every column, or a non-empty list of them, one per
    column (per label) of the model's head; read as ``(values, given_as_list)``."""

    def __init__(self, low: float, high: float):
        self.item = Number(low, high)

    def read(self, value: Any, where: str, ctx: Any) -> Tuple[List[float], bool]:
        if not isinstance(value, list):
            return [self.item.read(value, where, ctx)], False
        if not value:
            raise PolicyError(f"{where}: expected a number or a non-empty list of numbers")
        return [self.item.read(v, f"{where}[{i}]", ctx) for i, v in enumerate(value)], True

    def json(self) -> Dict[str, Any]:
        return {"anyOf": [self.item.json(), {"type": "array", "minItems": 1, "items": self.item.json()}]}

    def text(self) -> str:
        return f"{self.item.text()}, or a list of them (one per column of the head)"


def _list(value: Any, where: str, minimum: int) -> List[Any]:
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a list, got {_type_name(value)}")
    if len(value) < minimum:
        raise PolicyError(f"{where}: needs at least {minimum} entries, got {len(value)}")
    return value


class Strings(Type):
    """A list of non-empty strings (at least ``minimum``)."""

    def __init__(self, minimum: int = 0):
        self.minimum = minimum

    def read(self, value: Any, where: str, ctx: Any) -> List[str]:
        items = _list(value, where, self.minimum)
        for i, v in enumerate(items):
            if not isinstance(v, str) or not v:
                raise PolicyError(f"{where}[{i}]: expected a non-empty string, got {v!r}")
        return list(items)

    def json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": "array", "items": {"type": "string", "minLength": 1}}
        if self.minimum:
            out["minItems"] = self.minimum
        return out

    def text(self) -> str:
        return "list of non-empty strings"


class Params(Type):
    """Request parameter name -> a non-empty list of the non-empty string values clients
    may send; read as ``{name: (values...)}``."""

    def read(self, value: Any, where: str, ctx: Any) -> Dict[str, Tuple[str, ...]]:
        if not isinstance(value, Mapping):
            raise PolicyError(f"{where}: expected a mapping, got {_type_name(value)}")
        out: Dict[str, Tuple[str, ...]] = {}
        for name, values in value.items():
            if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
                raise PolicyError(f"{where}.{name}: expected a non-empty list of strings")
            out[str(name)] = tuple(values)
        return out

    def json(self) -> Dict[str, Any]:
        return {"type": "object", "additionalProperties": Strings(1).json()}

    def text(self) -> str:
        return "mapping: parameter name -> list of values"


class NodeRef(Type):
    """A policy node (a mapping with ``kind``), parsed by ``ctx.parse_node``."""

    has_nodes = True

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        return ctx.parse_node(value, where)

    def json(self) -> Dict[str, Any]:
        return {"$ref": "#/definitions/node"}

    def text(self) -> str:
        return "node"


class ListOf(Type):
    """A list of at least ``minimum`` values of ``item``."""

    def __init__(self, item: Type, minimum: int):
        self.item, self.minimum = item, minimum
        self.has_nodes = item.has_nodes

    def read(self, value: Any, where: str, ctx: Any) -> List[Any]:
        return [self.item.read(v, f"{where}[{i}]", ctx) for i, v in enumerate(_list(value, where, self.minimum))]

    def json(self) -> Dict[str, Any]:
        return {"type": "array", "minItems": self.minimum, "items": self.item.json()}

    def text(self) -> str:
        return f"list of {self.minimum}+ " + ("nodes" if isinstance(self.item, NodeRef) else self.item.text())

    def structs(self) -> Iterator["Struct"]:
        return self.item.structs()


def Nodes(minimum: int) -> ListOf:  # noqa: N802 - reads as a type in key tables
    """A list of at least ``minimum`` nodes."""
    return ListOf(NodeRef(), minimum)


class TrueOr(Type):
    """``true`` (every key of ``struct`` at its default) or a ``struct`` mapping."""

    def __init__(self, struct: "Struct"):
        self.struct = struct

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        return self.struct.read({} if value is True else value, where, ctx)

    def json(self) -> Dict[str, Any]:
        return {"anyOf": [{"const": True}, self.struct.json()]}

    def text(self) -> str:
        return f"`true` (the defaults) or {self.struct.text()}"

    def structs(self) -> Iterator["Struct"]:
        yield self.struct


# ----------------------------------------------------------------------------- mappings


@dataclass(frozen=True)
class Key:
    """One key of a mapping.

    Attributes:
        name: the key.
        type: its value type.
        doc: what it means, with units.
        computed: how the value is found when the key is absent (the build step computes
            it); None: the default comes from the dataclass field (see :class:`Struct`).
        attr: the dataclass field that holds its default when its name differs.
        nullable: ``null`` counts as absent.
        location: the location of its value in errors, instead of ``<mapping>.<name>``
            (``root``; a missing key is still ``<mapping>.<name>``).
        required: set by :class:`Struct` from the dataclass (field default :data:`REQUIRED`).
        default: set by :class:`Struct` from the dataclass (None: no default).
    """

    name: str
    type: Type
    doc: str
    computed: Optional[str] = None
    attr: Optional[str] = None
    nullable: bool = False
    location: Optional[str] = None
    required: bool = False
    default: Any = None


def _resolve(key: Key, target: Optional[type]) -> Key:
    """``key`` with ``required`` and ``default`` taken from ``target``'s field."""
    if key.computed is not None or target is None or not is_dataclass(target):
        return key
    f = {f.name: f for f in fields(target)}.get(key.attr or key.name)
    if f is None:
        return key
    if f.default is REQUIRED or (f.default is MISSING and f.default_factory is MISSING):
        return _replace(key, required=True)
    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]  # MISSING ruled out above
    return _replace(key, default=default)


class Struct(Type):
    """A mapping with the keys ``keys`` and no others.

    Args:
        name: its name in the docs (``limits``, ``model.calibration``).
        keys: its keys, in reading order.
        target: the dataclass whose field defaults are the keys' defaults.
        build: ``(values, where) -> value``: what :meth:`read` returns (default: the values
            dict); cross-key checks raise PolicyError naming ``where``.
        always: read (with every default) when the key holding it is absent.
        nonempty: the message when the mapping is empty (then it must have a key).
        one_of: ``(names, message)``: exactly one of these keys must be given.
        removed: keys a policy may no longer hold -> the message that says what replaces it.
        doc: one line for the docs.
    """

    def __init__(self, name: str, keys: Sequence[Key], target: Optional[type] = None, build: Optional[Callable[..., Any]] = None,
                 always: bool = False, nonempty: Optional[str] = None,
                 one_of: Optional[Tuple[Tuple[str, ...], str]] = None, doc: str = "",
                 removed: Optional[Mapping[str, str]] = None):
        self.name, self.target, self.build, self.always = name, target, build, always
        self.removed: Mapping[str, str] = dict(removed or {})
        self.nonempty, self.one_of, self.doc = nonempty, one_of, doc
        self.keys: Tuple[Key, ...] = tuple(_resolve(k, target) for k in keys)
        self.has_nodes = any(k.type.has_nodes for k in self.keys)

    def key(self, name: str) -> Key:
        """The key ``name`` (KeyError: not one of this mapping's)."""
        return next(k for k in self.keys if k.name == name)

    def check(self, value: Any, where: str) -> Mapping[str, Any]:
        """``value`` checked to be a mapping without keys outside :attr:`keys`.

        Raises:
            PolicyError: not a mapping, a removed key (saying what replaces it), or an
                unknown key (the first one).
        """
        if not isinstance(value, Mapping):
            raise PolicyError(f"{where}: expected a mapping, got {_type_name(value)}")
        names = [k.name for k in self.keys]
        gone = [k for k in value if k in self.removed]
        if gone:
            raise PolicyError(f"{where}.{gone[0]}: {self.removed[gone[0]]}")
        unknown = [k for k in value if k not in names]
        if unknown:
            raise PolicyError(f"{where}.{unknown[0]}: unknown key (expected one of: {', '.join(names)})")
        if self.nonempty and not value:
            raise PolicyError(f"{where}: {self.nonempty}")
        if self.one_of and sum(n in value for n in self.one_of[0]) != 1:
            raise PolicyError(f"{where}: {self.one_of[1]}")
        return value

    def read_key(self, key: Key, value: Mapping[str, Any], where: str, ctx: Any) -> Any:
        """The value of ``key`` in the mapping ``value`` (at ``where``): validated, or its
        default when absent.

        Raises:
            PolicyError: a required key is missing, or the value is invalid.
        """
        if key.name not in value or (key.nullable and value[key.name] is None):
            if key.required:
                raise PolicyError(f"{where}.{key.name}: required key is missing")
            if isinstance(key.type, Struct) and key.type.always:
                return key.type.read({}, f"{where}.{key.name}", ctx)
            return copy.deepcopy(key.default)
        return key.type.read(value[key.name], key.location or f"{where}.{key.name}", ctx)

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        value = self.check(value, where)
        values = {k.name: self.read_key(k, value, where, ctx) for k in self.keys}
        return self.build(values, where) if self.build else values

    def json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": "object", "additionalProperties": False,
                               "properties": {k.name: key_json(k) for k in self.keys}}
        required = [k.name for k in self.keys if k.required]
        if required:
            out["required"] = required
        if self.nonempty:
            out["minProperties"] = 1
        if self.one_of:
            out["oneOf"] = [{"required": [n]} for n in self.one_of[0]]
        if self.doc:
            out["description"] = self.doc
        return out

    def text(self) -> str:
        return f"mapping `{self.name}`"

    def structs(self) -> Iterator["Struct"]:
        yield self


def json_text(value: Any) -> str:
    """``value`` as written in YAML/JSON (``true``, ``128``, ``"mean"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {json_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists, for JSON; None when it is no JSON value."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return None


def key_json(key: Key) -> Dict[str, Any]:
    """One key as JSON Schema: its type, ``description`` and ``default``."""
    out = dict(key.type.json())
    if key.nullable:
        out = {"anyOf": [out, {"type": "null"}]}
    doc = key.doc + (f" (default: {key.computed})" if key.computed else "")
    out["description"] = doc
    if key.default is not None and _plain(key.default) is not None and not isinstance(key.type, Struct):
        out["default"] = _plain(key.default)
    return out
