"""Conditions of tensor pipelines (``pipeline`` policies): structured predicates over a
request's tensors and parameters, checked at load and evaluated as one vectorised row mask.

A condition is one mapping (the policy reference lists every key):

- ``{tensor: T, op: eq|ne|lt|le|gt|ge|in, value: V, reduce: all|any|max|min|sum|mean|argmax|count_nonzero}``:
  ``all``/``any`` (default ``all``) compare every element of a row with ``V`` and need all
  (any) of them to hold; the other reductions reduce each row to one number (``argmax``: the
  index of the row's largest element, flattened, the first on a tie) and compare that;
- ``{shape: {tensor: T, dim: I, op: ..., value: N}}``: the size of dimension ``I`` of each
  row (the batch dimension excluded when the router batches; negative counts from the end);
- ``{bytes: {tensor: T, empty: true|false}}``, ``{bytes: {tensor: T, length: {op: ..., value: N}}}``,
  ``{bytes: {tensor: T, prefix: "abc"}}``: BYTES elements (never decoded; ``prefix`` is
  UTF-8 encoded once at load), every element of the row (``reduce: any``: some element);
- ``{present: T}``: the tensor exists for the request (an optional input was sent, or a
  step produced it);
- ``{param: {name: N, equals: V}}``: the request parameter ``N`` equals ``V`` (bool, int or
  string; a string compares with the parameter's text);
- ``{all: [C, ...]}``, ``{any: [C, ...]}``, ``{not: C}``.

A "row" is one batch row when the router batches (``max_batch_size`` > 0) and the node's
scope is ``row``; otherwise the whole request is one row (``scope: request``, or a router
with ``max_batch_size: 0``). A condition on a tensor the request does not have is false
for every row (``{not: {present: T}}`` says so explicitly).

Literals are cast to the tensor's data type before comparing (``0.1`` compared with an FP16
tensor is FP16's 0.1, as a client would mean it); an integer tensor compared with a
non-integer literal, a string literal with a numeric tensor, or a number with a BYTES or
BOOL tensor is refused: at load when the tensor's type is known (a router input), else
as that request's error naming the condition. Only numpy and the standard library are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import InputError, PolicyError
from orchestrator.runtime.routing import schema as S

__all__ = ["Cond", "CondRef", "CONDITION", "OPS", "REDUCES", "read_condition", "condition_json", "evaluate", "literal_for"]

OPS: Tuple[str, ...] = ("eq", "ne", "lt", "le", "gt", "ge", "in")
#: Per-element (all, any) and per-row reductions.
REDUCES: Tuple[str, ...] = ("all", "any", "max", "min", "sum", "mean", "argmax", "count_nonzero")

_COMPARE: Dict[str, Callable[[Any, Any], Any]] = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


@dataclass(frozen=True)
class Cond:
    """One parsed condition (a tree for ``all``/``any``/``not``).

    Attributes:
        form: ``tensor``, ``shape``, ``bytes``, ``present``, ``param``, ``all``, ``any`` or ``not``.
        tensor: the pipeline tensor read (``tensor``, ``shape``, ``bytes``, ``present``).
        op: the comparison (``eq`` ... ``in``); for ``bytes`` with ``length``.
        value: the literal (a list for ``in``); for ``shape`` the size; for ``param`` the value.
        reduce: how a row's elements become one truth value (``tensor``, ``bytes``).
        dim: ``shape``'s dimension.
        empty, prefix: ``bytes``'s tests.
        name: ``param``'s parameter.
        parts: the conditions of ``all``/``any``/``not``.
        where: its location in the policy, for errors.
    """

    form: str
    tensor: str = ""
    op: str = "eq"
    value: Any = None
    reduce: str = "all"
    dim: int = 0
    empty: Optional[bool] = None
    prefix: Optional[bytes] = None
    name: str = ""
    parts: Tuple["Cond", ...] = ()
    where: str = ""

    def tensors(self) -> List[str]:
        """Every pipeline tensor the condition reads, in order, without repeats."""
        own = [self.tensor] if self.tensor else []
        return list(dict.fromkeys(own + [t for p in self.parts for t in p.tensors()]))

    def text(self) -> str:
        """The condition in words (``orchestrator policy check``)."""
        if self.form in ("all", "any"):
            return "(" + (" and " if self.form == "all" else " or ").join(p.text() for p in self.parts) + ")"
        if self.form == "not":
            return f"not {self.parts[0].text()}"
        if self.form == "present":
            return f"present({self.tensor})"
        if self.form == "param":
            return f"param {self.name} == {self.value!r}"
        if self.form == "shape":
            return f"{self.tensor}.shape[{self.dim}] {self.op} {self.value}"
        if self.form == "bytes":
            test = (f"empty={self.empty}" if self.empty is not None else f"prefix={self.prefix!r}" if self.prefix is not None
                    else f"length {self.op} {self.value}")
            return f"{self.reduce} bytes of {self.tensor}: {test}"
        return f"{self.reduce}({self.tensor}) {self.op} {self.value!r}"


# ----------------------------------------------------------------------------- declaration


class _Literal(S.Type):
    """A comparison literal: a number, boolean, string, or (for ``in``) a list of them."""

    def read(self, value: Any, where: str, ctx: Any) -> Any:
        ok = (bool, int, float, str)
        if isinstance(value, list) and value and all(isinstance(v, ok) for v in value):
            return list(value)
        if not isinstance(value, ok):
            raise PolicyError(f"{where}: expected a number, boolean, string or a non-empty list of them, got {value!r}")
        return value

    def json(self) -> Dict[str, Any]:
        scalar = {"type": ["number", "boolean", "string"]}
        return {"anyOf": [scalar, {"type": "array", "minItems": 1, "items": scalar}]}

    def text(self) -> str:
        return "number, boolean, string, or a list of them (for `in`)"


class CondRef(S.Type):
    """A condition as a key's value (recursive: ``all``/``any``/``not`` hold conditions; a step's and a case's ``when``)."""

    def read(self, value: Any, where: str, ctx: Any) -> Cond:
        """:func:`read_condition` of ``value`` (raises PolicyError naming ``where``)."""
        return read_condition(value, where)

    def json(self) -> Dict[str, Any]:
        """A reference to the JSON Schema's ``condition`` definition."""
        return {"$ref": "#/definitions/condition"}

    def text(self) -> str:
        """The type's name in the policy reference."""
        return "condition (`pipeline.condition`)"


_SHAPE = S.Struct("condition.shape", [
    S.Key("tensor", S.Str(), "the pipeline tensor", required=True),
    S.Key("dim", S.Int(-64, 63), "the dimension of each row (the batch dimension excluded when the router batches)",
          required=True),
    S.Key("op", S.Choice(OPS[:-1]), "the comparison", required=True),
    S.Key("value", S.Int(0, 1 << 62), "the size compared with", required=True),
], doc="A row's size along one dimension.")

_LENGTH = S.Struct("condition.bytes.length", [
    S.Key("op", S.Choice(OPS[:-1]), "the comparison", required=True),
    S.Key("value", S.Int(0, 1 << 62), "bytes", required=True),
], doc="An element's length in bytes.")

_BYTES = S.Struct("condition.bytes", [
    S.Key("tensor", S.Str(), "the BYTES tensor", required=True),
    S.Key("empty", S.Bool(), "the element has no bytes (true) or some (false)"),
    S.Key("length", _LENGTH, "the element's length in bytes"),
    S.Key("prefix", S.Str(empty=True), "the element starts with these bytes (the string UTF-8 encoded)"),
    S.Key("reduce", S.Choice(("all", "any")), "every element of the row (all, the default) or some (any)"),
], one_of=(("empty", "length", "prefix"), "give exactly one of empty, length, prefix"),
    doc="Tests of BYTES elements, never decoded.")

_PARAM = S.Struct("condition.param", [
    S.Key("name", S.Str(), "the request parameter", required=True),
    S.Key("equals", _Literal(), "its value (bool, int or string)", required=True),
], doc="A request parameter's value.")

#: The condition mapping; exactly one form per mapping (``tensor``, ``shape``, ``bytes``,
#: ``present``, ``param``, ``all``, ``any``, ``not``).
CONDITION = S.Struct("pipeline.condition", [
    S.Key("tensor", S.Str(), "compare this tensor's elements (with `op`, `value`, `reduce`)"),
    S.Key("op", S.Choice(OPS), "the comparison (`in`: `value` is a list)"),
    S.Key("value", _Literal(), "the literal, cast to the tensor's data type"),
    S.Key("reduce", S.Choice(REDUCES), "`all`/`any` (default `all`): every/some element of the row compared; "
          "`max`/`min`/`sum`/`mean`/`argmax`/`count_nonzero`: the row reduced to one number, then compared"),
    S.Key("shape", _SHAPE, "a row's size along a dimension"),
    S.Key("bytes", _BYTES, "a test of BYTES elements"),
    S.Key("present", S.Str(), "the tensor exists for the request"),
    S.Key("param", _PARAM, "a request parameter's value"),
    S.Key("all", S.ListOf(CondRef(), 1), "every condition holds"),
    S.Key("any", S.ListOf(CondRef(), 1), "some condition holds"),
    S.Key("not", CondRef(), "the condition does not hold"),
], one_of=(("tensor", "shape", "bytes", "present", "param", "all", "any", "not"),
           "give exactly one of tensor, shape, bytes, present, param, all, any, not"),
    doc="A condition (`when` of a step or a switch case), evaluated per row as one vectorised mask.")


def condition_json() -> Dict[str, Any]:
    """The JSON Schema of :data:`CONDITION` (``#/definitions/condition``)."""
    return CONDITION.json()


def read_condition(value: Any, where: str) -> Cond:
    """Parse a condition mapping (module docstring).

    Raises:
        PolicyError: naming ``where``: an unknown key, not exactly one form, a ``tensor`` form
            without ``op``/``value``, ``in`` without a list (or a list with another op), or keys of
            the ``tensor`` form beside another form.
    """
    v = CONDITION.read(value, where, None)
    if v["tensor"] is None:
        extra = [k for k in ("op", "value", "reduce") if v[k] is not None]
        if extra:
            raise PolicyError(f"{where}.{extra[0]}: belongs to the tensor form (`tensor: T`)")
    if v["tensor"] is not None:
        if v["op"] is None or v["value"] is None:
            raise PolicyError(f"{where}: the tensor form needs op and value")
        if (v["op"] == "in") != isinstance(v["value"], list):
            raise PolicyError(f"{where}.value: " + ("`in` needs a list" if v["op"] == "in" else f"a list needs op `in`, not {v['op']}"))
        return Cond("tensor", tensor=v["tensor"], op=v["op"], value=v["value"], reduce=v["reduce"] or "all", where=where)
    if v["shape"] is not None:
        s = v["shape"]
        return Cond("shape", tensor=s["tensor"], op=s["op"], value=s["value"], dim=s["dim"], where=where)
    if v["bytes"] is not None:
        b = v["bytes"]
        length = b["length"] or {}
        prefix = None if b["prefix"] is None else str(b["prefix"]).encode("utf-8")
        return Cond("bytes", tensor=b["tensor"], op=length.get("op", "eq"), value=length.get("value"), empty=b["empty"],
                    prefix=prefix, reduce=b["reduce"] or "all", where=where)
    if v["present"] is not None:
        return Cond("present", tensor=v["present"], where=where)
    if v["param"] is not None:
        if isinstance(v["param"]["equals"], (list, float)):
            raise PolicyError(f"{where}.param.equals: expected a bool, int or string (what a request parameter holds)")
        return Cond("param", name=v["param"]["name"], value=v["param"]["equals"], where=where)
    form = next(k for k in ("all", "any", "not") if v[k] is not None)
    parts = (v["not"],) if form == "not" else tuple(v[form])
    return Cond(form, parts=parts, where=where)


# ----------------------------------------------------------------------------- literals


def _kind(dtype: np.dtype[Any]) -> str:
    if dtype == np.object_ or dtype.kind in "SU":
        return "bytes"
    if dtype == np.bool_:
        return "bool"
    return "int" if dtype.kind in "iu" else "float"


def literal_for(cond: Cond, dtype: np.dtype[Any]) -> Any:
    """``cond``'s literal in ``dtype``, the data type of the tensor it reads (the type of a
    reduction's result for ``sum``/``mean``/``argmax``/``count_nonzero``, which need numbers).

    Raises:
        ValueError: the literal does not fit the data type (the message says how).
    """
    values = cond.value if isinstance(cond.value, list) else [cond.value]
    kind = _kind(dtype)
    if cond.reduce in ("sum", "mean", "argmax", "count_nonzero"):
        if kind == "bytes":
            raise ValueError(f"`{cond.reduce}` needs a numeric or BOOL tensor, '{cond.tensor}' is BYTES")
        if any(isinstance(v, (str, bool)) for v in values):
            raise ValueError(f"`{cond.reduce}` compares a number; got {cond.value!r}")
        return np.asarray(values, dtype=np.float64) if isinstance(cond.value, list) else np.float64(values[0])
    if kind == "bytes":
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"'{cond.tensor}' is BYTES: compare it with strings (UTF-8), got {cond.value!r}")
        out = [v.encode("utf-8") for v in values]
        return out if isinstance(cond.value, list) else out[0]
    if kind == "bool":
        if not all(isinstance(v, bool) for v in values):
            raise ValueError(f"'{cond.tensor}' is BOOL: compare it with true or false, got {cond.value!r}")
    elif any(isinstance(v, (str, bool)) for v in values):
        raise ValueError(f"'{cond.tensor}' is numeric ({dtype}): compare it with numbers, got {cond.value!r}")
    elif kind == "int" and any(float(v) != int(v) for v in values):
        raise ValueError(f"'{cond.tensor}' is an integer tensor ({dtype}): {cond.value!r} is not an integer")
    elif kind == "int":
        info = np.iinfo(dtype)
        if any(not info.min <= int(v) <= info.max for v in values):
            raise ValueError(f"{cond.value!r} is outside {dtype}'s range [{info.min}, {info.max}]")
    cast = np.asarray(values).astype(dtype)
    return cast if isinstance(cond.value, list) else cast[0]


# ----------------------------------------------------------------------------- evaluation


def _rows(array: NDArray[Any], rows: int, per_row: bool) -> NDArray[Any]:
    """``array`` as ``[rows, elements]``: one line per batch row (``per_row``), else the
    whole request as one line repeated for each of ``rows``."""
    if per_row:
        return array.reshape(rows, -1)
    return np.broadcast_to(array.reshape(1, -1), (rows, array.size))


def _row_truth(cmp: NDArray[Any], reduce: str) -> NDArray[Any]:
    out: NDArray[Any] = cmp.any(axis=1) if reduce == "any" else cmp.all(axis=1)
    return out


def _reduced(cond: Cond, x: NDArray[Any]) -> NDArray[Any]:
    """Each line of ``x`` ``[rows, n]`` reduced (``max`` ... ``count_nonzero``), float64
    ``[rows]``; a line without elements: NaN (every comparison false) but for ``sum`` and
    ``count_nonzero`` (0)."""
    rows, n = x.shape
    out: NDArray[Any]
    if cond.reduce == "count_nonzero":
        out = np.count_nonzero(x, axis=1).astype(np.float64)
    elif cond.reduce == "sum":
        out = x.sum(axis=1, dtype=np.float64) if n else np.zeros(rows)
    elif not n:
        out = np.full(rows, np.nan)
    elif cond.reduce == "argmax":
        out = np.argmax(x, axis=1).astype(np.float64)
    elif cond.reduce == "mean":
        out = x.mean(axis=1, dtype=np.float64)
    else:
        out = x.max(axis=1) if cond.reduce == "max" else x.min(axis=1)
    return out


def _compare(op: str, x: NDArray[Any], literal: Any) -> NDArray[Any]:
    if op == "in":
        out: NDArray[Any] = np.isin(x, np.asarray(literal, dtype=x.dtype) if x.dtype != np.object_ else literal)
        return out
    return np.asarray(_COMPARE[op](x, literal), dtype=bool)


def _bytes_mask(cond: Cond, x: NDArray[Any]) -> NDArray[Any]:
    if x.dtype != np.object_:
        raise InputError(f"{cond.where}: '{cond.tensor}' is {x.dtype}, not BYTES")
    flat = x.reshape(-1)
    if cond.prefix is not None:
        prefix = cond.prefix
        hits = np.fromiter((bytes(e).startswith(prefix) for e in flat), dtype=bool, count=flat.size)
    else:
        lengths = np.fromiter((len(e) for e in flat), dtype=np.int64, count=flat.size)
        hits = (lengths == 0) == bool(cond.empty) if cond.empty is not None else _compare(cond.op, lengths, cond.value)
    return _row_truth(hits.reshape(x.shape), cond.reduce)


def evaluate(cond: Cond, tensors: Mapping[str, NDArray[Any]], rows: int, per_row: bool,
             params: Mapping[str, Any]) -> NDArray[Any]:
    """The rows where ``cond`` holds: bool ``[rows]``.

    Args:
        cond: the condition.
        tensors: the request's pipeline tensors (absent ones are missing keys); with
            ``per_row`` each has ``rows`` as its first dimension.
        rows: the request's rows (1 when the whole request is one row).
        per_row: one truth value per batch row; False: the request as a whole.
        params: the request's parameters.

    Raises:
        InputError: a literal that does not fit the tensor's data type, or a BYTES test of
            another data type (the message names the condition).
    """
    if cond.form in ("all", "any", "not"):
        masks = [evaluate(p, tensors, rows, per_row, params) for p in cond.parts]
        if cond.form == "not":
            return ~masks[0]
        out: NDArray[Any] = np.logical_and.reduce(masks) if cond.form == "all" else np.logical_or.reduce(masks)
        return out
    if cond.form == "param":
        got = params.get(cond.name)
        same = got is not None and (str(got) == cond.value if isinstance(cond.value, str) and not isinstance(got, bool)
                                    else type(got) is type(cond.value) and got == cond.value)
        return np.full(rows, same)
    array = tensors.get(cond.tensor)
    if cond.form == "present" or array is None:
        return np.full(rows, array is not None)
    if cond.form == "shape":
        shape = array.shape[1:] if per_row else array.shape
        try:
            size = shape[cond.dim]
        except IndexError:
            return np.zeros(rows, bool)
        return np.full(rows, bool(_COMPARE[cond.op](size, cond.value)))
    x = _rows(array, rows, per_row)
    if cond.form == "bytes":
        return _bytes_mask(cond, x)
    try:
        literal = literal_for(cond, array.dtype)
    except ValueError as exc:
        raise InputError(f"{cond.where}: {exc}") from None
    if cond.reduce in ("all", "any"):
        return _row_truth(_compare(cond.op, x, literal).reshape(x.shape), cond.reduce)
    return _compare(cond.op, _reduced(cond, x), literal)


def check_literals(cond: Cond, dtypes: Mapping[str, np.dtype[Any]]) -> None:
    """Check ``cond``'s literals against the data types known at load (``dtypes``: tensor ->
    numpy dtype; tensors missing from it are checked per request).

    Raises:
        PolicyError: naming the condition.
    """
    for part in cond.parts:
        check_literals(part, dtypes)
    dtype = dtypes.get(cond.tensor)
    if dtype is None:
        return
    if cond.form == "tensor":
        try:
            literal_for(cond, dtype)
        except ValueError as exc:
            raise PolicyError(f"{cond.where}: {exc}") from None
    if cond.form == "bytes" and _kind(dtype) != "bytes":
        raise PolicyError(f"{cond.where}.bytes: '{cond.tensor}' is {dtype}, not BYTES")


def sequence_tensors(conds: Sequence[Cond]) -> List[str]:
    """Every tensor the conditions read, in order, without repeats."""
    return list(dict.fromkeys(t for c in conds for t in c.tensors()))
