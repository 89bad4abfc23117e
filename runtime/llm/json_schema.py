"""A JSON Schema as a grammar: every output the grammar admits validates against the schema.

:func:`schema_grammar` turns a schema into GBNF for runtime.llm.grammar. The grammar admits a subset of the valid
instances, never an invalid one: an object gets its declared properties only (required ones always, optional ones
in their declared order), which every ``additionalProperties`` allows; an array's length, a string's length and an
integer's range are spelled out digit by digit; a number range admits the integers in it and decimals strictly
inside it. A keyword the grammar cannot enforce (``pattern``, ``multipleOf``, ``uniqueItems``, ``not``...) is
refused, naming its path in the schema, rather than ignored: the caller was promised valid output.

Bounds keep one request's schema small to convert and to walk at each token: :data:`MAX_SCHEMA_DEPTH` levels,
:data:`MAX_SCHEMA_NODES` subschemas, lengths and item counts up to :data:`MAX_REPEAT`, integers of up to
:data:`MAX_DIGITS` digits, and the GBNF itself within runtime.llm.grammar.MAX_GBNF_BYTES.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from runtime.errors import BadInput
from runtime.llm.grammar import Grammar, literal

__all__ = ["MAX_DIGITS", "MAX_REPEAT", "MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES", "SchemaRules", "schema_grammar"]

MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000
MAX_REPEAT = 1024  # minLength, maxLength, minItems, maxItems
MAX_DIGITS = 15  # an integer's digits: 15 fit a JSON number (a double) exactly
MAX_ENUM = 512

ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated", "readOnly",
               "writeOnly", "$anchor", "strict"}
# Keywords that only constrain what the grammar never emits (extra properties, extra array items of a closed
# tuple) or that hold definitions: accepted and honoured by omission.
HONOURED = {"additionalProperties", "unevaluatedProperties", "$defs", "definitions"}
KNOWN = {"type", "properties", "required", "items", "minItems", "maxItems", "enum", "const", "minimum", "maximum",
         "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "format", "anyOf", "oneOf", "allOf", "$ref"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

_WS = "ws"
_PRIMITIVES = {
    "ws": r'( " " | "\n" [ \t]{0,20} )?',
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] )',
    "string": r'"\"" char* "\"" ws',
    "number": r'"-"? ( "0" | [1-9] [0-9]{0,14} ) ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,3} )? ws',
    "integer": r'( "0" | "-"? [1-9] [0-9]{0,14} ) ws',
    "boolean": r'( "true" | "false" ) ws',
    "null": r'"null" ws',
    "value": r'object | array | string | number | boolean | null',
    "object": r'"{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws',
    "array": r'"[" ws ( value ( "," ws value )* )? "]" ws',
}
_DEPS = {"string": ("char", "ws"), "number": ("ws",), "integer": ("ws",), "boolean": ("ws",), "null": ("ws",),
         "value": ("object", "array", "string", "number", "boolean", "null"), "object": ("ws", "string", "value"),
         "array": ("ws", "value")}
_FORMATS = {
    "date": r'"\"" [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) "\"" ws',
    "time": (r'"\"" ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? '
             r'( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ) "\"" ws'),
    "uuid": r'"\"" [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12} "\"" ws',
}
_FORMATS["date-time"] = _FORMATS["date"].removesuffix(r' "\"" ws') + r' "T" ' + _FORMATS["time"].removeprefix(r'"\"" ')


def _json_literal(value: Any) -> str:
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) + " ws"


# -- integer ranges, digit by digit -------------------------------------------------------------------------------
def _digits_between(lo: str, hi: str) -> str:
    """GBNF for the decimal numerals from ``lo`` to ``hi`` (same length, lo <= hi, no sign)."""
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    if lo == "0" * len(lo) and hi == "9" * len(hi):
        return f"[0-9]{{{len(lo)}}}"
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ( {_digits_between(lo[1:], hi[1:])} )'
    rest = len(lo) - 1
    alts = [f'"{lo[0]}" ( {_digits_between(lo[1:], "9" * rest)} )']
    if int(lo[0]) + 1 <= int(hi[0]) - 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}] [0-9]{{{rest}}}")
    alts.append(f'"{hi[0]}" ( {_digits_between("0" * rest, hi[1:])} )')
    return " | ".join(alts)


def _naturals(lo: int, hi: int) -> str:
    """GBNF for the integers lo..hi, 0 <= lo <= hi, written without leading zeros."""
    alts = []
    a, b = str(lo), str(hi)
    for n in range(len(a), len(b) + 1):
        first = a if n == len(a) else "1" + "0" * (n - 1)
        last = b if n == len(b) else "9" * n
        if int(first) <= int(last):
            alts.append(_digits_between(first, last))
    return " | ".join(f"( {alt} )" for alt in alts)


def _integers(lo: int, hi: int) -> str:
    """GBNF for the integers lo..hi (either sign)."""
    alts = []
    if lo < 0:
        alts.append(f'"-" ( {_naturals(max(1, -hi), -lo)} )')
    if hi >= 0:
        alts.append(_naturals(max(0, lo), hi))
    return " | ".join(f"( {alt} )" for alt in alts)


class _Converter:
    def __init__(self, root: Any, where: str, max_string: int | None = None, max_items: int | None = None) -> None:
        self.root, self.where = root, where
        self.max_string, self.max_items = max_string, max_items  # caps where the schema sets none (tool arguments)
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}  # "#/$defs/x" -> its rule
        self.nodes = 0

    # -- helpers
    def fail(self, path: str, what: str) -> BadInput:
        return BadInput(f"{self.where}{path}: {what}"[:400])

    def rule(self, name: str, body: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        name, i = base, 1
        while name in self.rules or name in _PRIMITIVES:
            i += 1
            name = f"{base}-{i}"
        self.rules[name] = body
        return name

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _PRIMITIVES.get(name) or _FORMATS[name]
            for dep in _DEPS.get(name, ("ws",) if name in _FORMATS else ()):
                self.primitive(dep)
        return name

    def count(self, schema: dict[str, Any], key: str, path: str, default: int | None) -> int | None:
        value = schema.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPEAT:
            raise self.fail(f"{path}.{key}", f"must be an integer from 0 to {MAX_REPEAT}, got {value!r}"[:120])
        return value

    def bound(self, schema: dict[str, Any], key: str, path: str) -> float | None:
        value = schema.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{path}.{key}", f"must be a number, got {value!r}"[:120])
        if abs(value) >= 10**MAX_DIGITS:
            raise self.fail(f"{path}.{key}", f"{value!r} has more than {MAX_DIGITS} digits")
        return value

    # -- the walk
    def visit(self, schema: Any, path: str, depth: int) -> str:
        """The GBNF for ``schema`` at ``path``: a rule name, or an expression in parentheses."""
        expr = self._visit(schema, path, depth)
        return expr if re.fullmatch(r"[a-zA-Z0-9-]+", expr) else f"( {expr} )"

    def _visit(self, schema: Any, path: str, depth: int) -> str:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise self.fail("", f"has more than {MAX_SCHEMA_NODES} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            raise self.fail(path, f"is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise self.fail(path, "is false: no value is valid")
        if not isinstance(schema, dict):
            raise self.fail(path, f"must be a schema (an object or true), got {type(schema).__name__}")
        for key in schema:
            if key not in KNOWN and key not in ANNOTATIONS and key not in HONOURED:
                raise self.fail(f"{path}.{key}"[:200], "is not a keyword this server can enforce while decoding "
                                f"(supported: {', '.join(sorted(KNOWN))})")
        if "$ref" in schema:
            return self.ref(schema["$ref"], path, depth)
        if "const" in schema:
            return self.enum([schema["const"]], path)
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values or len(values) > MAX_ENUM:
                raise self.fail(f"{path}.enum", f"must be a list of 1 to {MAX_ENUM} values")
            return self.enum(values, f"{path}.enum")
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                return self.combined(schema, key, path, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind or not all(isinstance(t, str) and t in TYPES for t in kind) or len(set(kind)) != len(kind):
                raise self.fail(f"{path}.type", f"must be one of {', '.join(TYPES)} or a list of distinct ones")
            return " | ".join(f"( {self.typed(schema, t, path, depth)} )" for t in kind)
        if kind is None:
            kind = self.implied_type(schema, path)
            if kind is None:
                return self.primitive("value")
        if kind not in TYPES:
            raise self.fail(f"{path}.type", f"{kind!r} is not valid: use one of {', '.join(TYPES)}"[:200])
        return self.typed(schema, kind, path, depth)

    def implied_type(self, schema: dict[str, Any], path: str) -> str | None:
        kinds = {k for keys, k in ((("properties", "required"), "object"), (("items", "minItems", "maxItems"), "array"),
                                   (("minLength", "maxLength", "format"), "string"),
                                   (("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"), "number"))
                 if any(key in schema for key in keys)}
        if len(kinds) > 1:
            raise self.fail(path, "mixes keywords of several types without a type: name it")
        return kinds.pop() if kinds else None

    def ref(self, ref: Any, path: str, depth: int) -> str:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise self.fail(f"{path}.$ref", "only local references (#/$defs/NAME) are followed; nothing is fetched")
        if ref in self.refs:
            return self.refs[ref]
        target: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise self.fail(f"{path}.$ref", f"{ref[:100]!r} names nothing in the schema")
            target = target[part]
        name = self.rule("ref-" + ref[2:], "")  # named first: a schema may refer to itself
        self.refs[ref] = name
        self.rules[name] = self.visit(target, ref[1:].replace("/", "."), depth + 1)
        return name

    def enum(self, values: list[Any], path: str) -> str:
        try:
            return " | ".join(_json_literal(v) for v in values)
        except (TypeError, ValueError):
            raise self.fail(path, "holds a value that is not JSON") from None

    def combined(self, schema: dict[str, Any], key: str, path: str, depth: int) -> str:
        parts = schema[key]
        if not isinstance(parts, list) or not parts:
            raise self.fail(f"{path}.{key}", "must be a non-empty list of schemas")
        if len(set(schema) & {"anyOf", "oneOf", "allOf", "type", "properties", "items", "enum", "const"}) > 1:
            raise self.fail(path, f"combines {key} with other constraints: put them inside each alternative")
        if key == "allOf":
            if len(parts) != 1:
                raise self.fail(f"{path}.allOf", "is enforced with one schema only: merge the schemas into one")
            return self.visit(parts[0], f"{path}.allOf[0]", depth + 1)
        if key == "oneOf":  # exactly one must match: enforced when the alternatives cannot overlap (distinct types)
            kinds = [p.get("type") if isinstance(p, dict) else None for p in parts]
            if any(not isinstance(k, str) for k in kinds) or len(set(kinds)) != len(kinds):
                raise self.fail(f"{path}.oneOf", "is enforced only for alternatives of distinct types: use anyOf")
        return " | ".join(f"( {self.visit(p, f'{path}.{key}[{i}]', depth + 1)} )" for i, p in enumerate(parts))

    def typed(self, schema: dict[str, Any], kind: str, path: str, depth: int) -> str:
        if kind == "object":
            return self.object(schema, path, depth)
        if kind == "array":
            return self.array(schema, path, depth)
        if kind == "string":
            return self.string(schema, path)
        if kind in ("integer", "number"):
            return self.number(schema, kind, path)
        return self.primitive(kind)

    def object(self, schema: dict[str, Any], path: str, depth: int) -> str:
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise self.fail(f"{path}.properties", "must be an object of schemas")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.fail(f"{path}.required", "must be a list of property names")
        # a required name that is not a declared property is an additional one: it takes their schema
        extra = schema.get("additionalProperties", schema.get("unevaluatedProperties", True))
        missing = [r for r in required if r not in props]
        if missing and extra is False:
            raise self.fail(f"{path}.required", f"names {missing[0]!r}, which no property allows")
        kv = {}
        for name in [*props, *missing]:
            sub = props[name] if name in props else extra
            value = self.visit(sub, f"{path}.properties.{name}", depth + 1)
            kv[name] = f'{literal(json.dumps(name, ensure_ascii=False))} ws ":" ws {value}'
        req = [kv[n] for n in kv if n in required]
        opt = [kv[n] for n in kv if n not in required]
        if req:
            body = ' "," ws '.join(req) + "".join(f' ( "," ws {o} )?' for o in opt)
        elif opt:  # no required one: the first present one has no comma before it
            alts = [opt[i] + "".join(f' ( "," ws {o} )?' for o in opt[i + 1 :]) for i in range(len(opt))]
            body = "( " + " | ".join(f"( {a} )" for a in alts) + " )?"
        else:
            body = ""
        self.primitive("ws")
        return self.rule(f"obj{path}", f'"{{" ws {body} "}}" ws')

    def array(self, schema: dict[str, Any], path: str, depth: int) -> str:
        lo = self.count(schema, "minItems", path, 0) or 0
        hi = self.count(schema, "maxItems", path, None)
        if hi is not None and hi < lo:
            raise self.fail(f"{path}.maxItems", f"{hi} is under minItems {lo}")
        if hi is None and self.max_items is not None:  # more items of an enum than it has values repeat one
            items = schema.get("items")
            values = items.get("enum") if isinstance(items, dict) else None
            hi = max(lo, min(self.max_items, len(values)) if isinstance(values, list) and values else self.max_items)
        item = self.visit(schema.get("items", True), f"{path}.items", depth + 1)
        item = self.rule(f"item{path}", item)
        self.primitive("ws")
        if hi == 0:
            return self.rule(f"arr{path}", '"[" ws "]" ws')
        if hi == 1:
            body = item if lo == 1 else f"{item}?"
        else:
            tail = f'( "," ws {item} ){{{max(lo - 1, 0)},{"" if hi is None else hi - 1}}}'
            body = f"{item} {tail}" if lo >= 1 else f"( {item} {tail} )?"
        return self.rule(f"arr{path}", f'"[" ws {body} "]" ws')

    def string(self, schema: dict[str, Any], path: str) -> str:
        fmt = schema.get("format")
        if fmt is not None:
            if fmt not in _FORMATS:
                raise self.fail(f"{path}.format", f"{fmt!r} cannot be enforced (supported: {', '.join(_FORMATS)})"[:200])
            if "minLength" in schema or "maxLength" in schema:
                raise self.fail(path, "combines format with minLength/maxLength")
            return self.primitive(fmt)
        lo = self.count(schema, "minLength", path, 0) or 0
        hi = self.count(schema, "maxLength", path, None)
        if hi is not None and hi < lo:
            raise self.fail(f"{path}.maxLength", f"{hi} is under minLength {lo}")
        if hi is None and self.max_string is not None:
            hi = max(lo, self.max_string)
        if lo == 0 and hi is None:
            return self.primitive("string")
        self.primitive("char")
        self.primitive("ws")
        return self.rule(f"str{path}", f'"\\"" char{{{lo},{"" if hi is None else hi}}} "\\"" ws')

    def number(self, schema: dict[str, Any], kind: str, path: str) -> str:
        lo, hi = self.bound(schema, "minimum", path), self.bound(schema, "maximum", path)
        xlo, xhi = self.bound(schema, "exclusiveMinimum", path), self.bound(schema, "exclusiveMaximum", path)
        if lo is None and hi is None and xlo is None and xhi is None:
            return self.primitive(kind)
        cap = 10**MAX_DIGITS - 1
        # the integers allowed
        ilo = max([-cap] + ([math.ceil(lo)] if lo is not None else []) + ([math.floor(xlo) + 1] if xlo is not None else []))
        ihi = min([cap] + ([math.floor(hi)] if hi is not None else []) + ([math.ceil(xhi) - 1] if xhi is not None else []))
        # a decimal n.f (f > 0, so n < n.f < n + 1) lies strictly inside [n, n + 1]: n >= the lowest bound's
        # ceiling and n + 1 <= the highest bound's floor (fractions only where n >= 0, or n <= -1 with n - 1 >= lo)
        low = max([-cap] + [math.ceil(b) for b in (lo, xlo) if b is not None])
        high = min([cap] + [math.floor(b) for b in (hi, xhi) if b is not None])
        alts = []
        if ilo <= ihi:
            alts.append(f"( {_integers(ilo, ihi)} )")
        if kind == "number":
            frac = r'"." [0-9]{0,5} [1-9]'
            pos_lo, pos_hi = max(low, 0), high - 1
            if pos_lo <= pos_hi:
                alts.append(f"( {_naturals(pos_lo, pos_hi)} ) {frac}")
            neg_lo, neg_hi = max(1, -min(high, 0)), -(low + 1) if low + 1 <= 0 else 0  # -n.f with n in neg_lo..neg_hi
            if 1 <= neg_lo <= neg_hi:
                alts.append(f'"-" ( {_naturals(neg_lo, neg_hi)} ) {frac}')
        if not alts:
            raise self.fail(path, "admits no number: its bounds exclude every value")
        self.primitive("ws")
        return self.rule(f"num{path}", "( " + " | ".join(alts) + " ) ws")


class SchemaRules:
    """The rules of several schemas in one grammar (a tool list: one arguments schema per tool). Each schema's
    ``$ref``s resolve within it; the subschema bound counts them all together. ``max_string``, ``max_items``: the
    length of a string and the items of an array where a schema sets no maximum (an array of enum values: at most as
    many as the enum has), so that every answer ends; what they admit still validates (a subset of the instances)."""

    def __init__(self, *, max_string: int | None = None, max_items: int | None = None) -> None:
        self._conv = _Converter(None, "the schema", max_string, max_items)

    def add(self, schema: Any, where: str) -> str:
        """A GBNF expression (a rule name or a parenthesised expression) admitting exactly what the grammar of
        ``schema`` admits; BadInput naming ``where`` + the keyword's path of what cannot be enforced."""
        conv = self._conv
        conv.root, conv.where, conv.refs = schema, where, {}
        return conv.visit(schema, "", 0)

    def grammar(self, root: str, what: str, rules: dict[str, str] | None = None) -> Grammar:
        """The grammar whose start is ``root`` (an expression over the added schemas and ``rules``)."""
        lines = [f"root ::= {root}", *(f"{n} ::= {b}" for n, b in (rules or {}).items()),
                 *(f"{n} ::= {b}" for n, b in self._conv.rules.items())]
        return Grammar("\n".join(lines) + "\n", what)


def schema_grammar(schema: Any, where: str = "the schema") -> Grammar:
    """The grammar of ``schema`` (a parsed JSON Schema); BadInput naming the path (``where`` + the keyword's path)
    of what cannot be enforced or is out of bounds."""
    rules = SchemaRules()
    return rules.grammar(rules.add(schema, where), f"{where} (as a grammar)")
