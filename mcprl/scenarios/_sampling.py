"""Sampling tool arguments that satisfy a JSON schema, from values the server itself shows.

Strings come from the schema (enums, examples, defaults, formats such as date-time or email,
a `pattern`, drawn with `rstr` when nothing the server showed matches it),
examples quoted in the tool's and the parameter's descriptions ("e.g. 'America/New_York'"), the
server's resources, and the results of earlier calls (titles, names, ids); numbers are the
schema's default or small "nice" values inside its bounds. Optional arguments are usually left
out, as a user would.
"""

from __future__ import annotations

import random
import re
from typing import Any

import rstr

from mcprl.mcp import ServerInfo, name_words
from mcprl.scenarios._parse import parse_result

__all__ = [
    "SKIP",
    "SQL_ROWS",
    "SchemaSampler",
    "ValuePool",
    "free_text_kind",
    "listed_name",
    "singular",
]

SKIP = object()  # "leave this optional argument out"

_FALLBACK_PHRASES = [
    "weekly groceries",
    "project kickoff",
    "call the dentist",
    "team meeting notes",
    "birthday gift ideas",
    "reading list",
    "travel plans",
    "quarterly report",
]
# parameters that take a small whole number, by name
_SMALL_INT_NAMES = {"n", "exponent", "power", "degree", "k", "count", "limit", "top"}
# a "number" that counts things ("the last N lines", "the number of results") takes whole ones
_COUNTS = re.compile(r"\bN\b|\bnumber of\b|\bhow many\b")
_PHRASE = re.compile(r"[A-Za-z][A-Za-z .'\-]{2,40}[A-Za-z]")


def _counts(schema: dict[str, Any], name: str) -> bool:
    """Whether a numeric parameter takes a whole number, by its name or its description."""
    return name.lower() in _SMALL_INT_NAMES or bool(_COUNTS.search(schema.get("description") or ""))


SQL_ROWS = 200  # rows read from a table; a table that fills them is not read whole
_PATH_WORDS = {"path", "paths", "dir", "directory", "folder", "root", "repo", "repository"}
_SQL_PARAMS = {"sql", "query", "statement", "sql_query"}
_SQL_WORDS = re.compile(r"\b(?:SQL|SELECT|sqlite|postgres\w*|mysql|duckdb|database)\b", re.I)
_EXPRESSION_PARAMS = {"expression", "expr", "formula", "equation", "calculation", "math"}
_EXPRESSION_WORDS = re.compile(r"\b(?:calculat\w*|evaluat\w*|arithmetic|math\w*)\b", re.I)


def free_text_kind(tool: Any, name: str, prop: dict[str, Any]) -> str | None:
    """ "sql", "expression" or "expressions" (an array of them) for a text parameter that takes
    one, by its name and the tool's and the parameter's descriptions; else None."""
    words = set(name_words(name))
    text = f"{tool.description or ''} {prop.get('description') or ''}"
    kind = prop.get("type", "string")
    if (
        kind == "string"
        and (words & _SQL_PARAMS or name in _SQL_PARAMS)
        and _SQL_WORDS.search(text)
    ):
        return "sql"
    singular_words = {singular(w) for w in words}
    if singular_words & _EXPRESSION_PARAMS and (
        _EXPRESSION_WORDS.search(text) or words & {"expression", "expressions"}
    ):
        if kind == "string" and "enum" not in prop:
            return "expression"
        if kind == "array" and (prop.get("items") or {}).get("type", "string") == "string":
            return "expressions"
    return None


def _vary_numbers(example: str, rng: random.Random) -> str:
    """An example with other numbers half the time: '5 m to km' gives '37 m to km'."""
    alone = re.compile(r"(?<![\d:/.\-])\d+(?![\d:/.\-])")  # not a time, a date or a version
    if rng.random() < 0.5 or not alone.search(example):
        return example
    return alone.sub(lambda m: str(rng.randint(2, 120)), example, count=1)


def _is_id_name(name: str) -> bool:
    return name == "id" or name.endswith(("_id", "Id"))


class ValuePool:
    """Values seen on the server, to draw realistic arguments from."""

    def __init__(self) -> None:
        self.phrases: list[str] = []  # from resources and descriptions
        self.learned: list[str] = []  # names and titles seen in results
        self.ids: list[Any] = []
        self.by_key: dict[str, list[Any]] = {}  # scalar values seen under each result key
        self.examples: dict[str, list[str]] = {}  # quoted in any tool's description, by parameter
        self.tables: list[str] = []  # SQL tables the server showed
        self.paths: list[str] = []  # paths the user gave the server, and files seen in them

    @classmethod
    def from_server(cls, info: ServerInfo) -> ValuePool:
        pool = cls()
        for r in info.resources:
            data = parse_result(r.text) if r.text else ""
            if isinstance(data, (dict, list)):
                pool.learn(data)  # records: their names and ids are values for the tools
            elif r.text:
                pool.add_phrases(re.split(r"[,;:\n]", r.text))
        for p in info.prompts:  # what the server expects to be asked about
            pool.add_phrases(re.split(r"[,;:.\n]", p.description))
        for tool in info.tools:
            for name, values in _tool_examples(tool).items():
                known = pool.examples.setdefault(name, [])
                known.extend(v for v in values if v not in known)
        return pool

    def examples_for(self, name: str) -> list[str]:
        """Examples given for this parameter by any tool, or for one of the same kind: the
        `timezone` examples of one tool serve `source_timezone` in another."""
        kind = name_words(name)[-1:]
        if kind and kind[0] in _GENERIC_WORDS:  # a file's `name` is no table's `table_name`
            kind = []
        out: list[str] = []
        for key, values in self.examples.items():
            if key == name or (kind and name_words(key)[-1:] == kind):
                out.extend(v for v in values if v not in out)
        return out

    def add_phrases(self, candidates: list[str], into: list[str] | None = None) -> None:
        target = self.phrases if into is None else into
        for c in candidates:
            c = c.strip().strip(".")
            words = c.split()
            if 1 <= len(words) <= 5 and _PHRASE.fullmatch(c) and c not in target:
                target.append(c)

    def learn(self, value: Any) -> None:
        """Take ids, names and other values from a tool result (parsed JSON). What a list
        holds is also kept under its singular: the names in `{"tables": [{"name": "fruit"}]}`
        are values for a `table` parameter."""
        for key, items in _lists(value):
            noun = singular(key)
            for item in items:
                name = listed_name(item, _NAME_KEYS)
                if isinstance(name, (str, int)) and not isinstance(name, bool):
                    self._keep(noun, name)
        for key, v in _walk(value):
            if key is None or isinstance(v, (dict, list, bool)) or v is None:
                continue
            if _is_id_name(key):
                if v not in self.ids:
                    self.ids.append(v)
                continue
            self._keep(key, v)
            if isinstance(v, str) and key in ("title", "name", "author"):
                self.add_phrases([v], into=self.learned)

    def _keep(self, key: str, value: Any) -> None:
        seen = self.by_key.setdefault(key, [])
        if value not in seen and len(seen) < 200:
            seen.append(value)

    def observed(self, name: str, numeric: bool) -> list[Any]:
        """Values seen under a result key that this parameter name refers to: the same name
        first (table: table), then a part of it (max_price: price, table_name: table)."""
        parts = name_words(name)
        for exact in (True, False):
            for key, values in self.by_key.items():
                if exact and key != name:
                    continue
                if not exact and not (len(key) > 2 and key.lower() in parts):
                    continue
                matching = [v for v in values if isinstance(v, (int, float)) == numeric]
                if matching:
                    return matching
        return []


_NAME_KEYS = ("name", "title", "key", "path", "id")
# last words that say too little of what a parameter holds to share examples across tools
_GENERIC_WORDS = {"name", "id", "key", "path", "text", "value", "query", "type", "data", "input"}


def listed_name(item: Any, keys: tuple[str, ...] = ("name", "title", "path")) -> Any:
    """What names an item of a listing: the item itself, or its first field among `keys`."""
    if isinstance(item, dict):
        return next((item[k] for k in keys if k in item), None)
    return item


def singular(word: str) -> str:
    """tables: table, entries: entry, classes: class; other words as they are."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def _lists(value: Any, key: str | None = None):
    """(key, list) for every non-empty list held under a key."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _lists(v, str(k))
    elif isinstance(value, list):
        if key and value:
            yield key, value
        for v in value:
            yield from _lists(v, None)


def _walk(value: Any, key: str | None = None):
    yield key, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)


_QUOTED = re.compile(r"""['"`]([^'"`\n]{1,80})['"`]""")
_INTRO = re.compile(
    r"\b(?:e\.\s?g\.|eg\b|for example|for instance|such as|like|examples?:)", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"[.;]\s|\n\s*\n")


def described_examples(description: str, params: list[str]) -> dict[str, list[str]]:
    """Example values quoted in a description ("a time-zone name, e.g. 'America/New_York'"),
    by the parameter named last before them; with one parameter, unattributed ones are its."""
    events: list[tuple[int, str, str]] = []
    for name in params:
        pattern = rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"
        events += [(m.start(), "param", name) for m in re.finditer(pattern, description)]
    for intro in _INTRO.finditer(description):
        tail = description[intro.end() : intro.end() + 200]
        end = _SENTENCE_END.search(tail)
        tail = tail[: end.start() + 1] if end else tail
        events += [(intro.end() + q.start(), "example", q.group(1)) for q in _QUOTED.finditer(tail)]
    out: dict[str, list[str]] = {}
    current: list[str] = []
    loose: list[str] = []
    previous = ""
    for _, kind, value in sorted(events):
        if kind == "param":
            current = [*current, value] if previous == "param" else [value]
        else:
            for name in current or []:
                out.setdefault(name, []).append(value)
            if not current:
                loose.append(value)
        previous = kind
    if loose and len(params) == 1:
        out.setdefault(params[0], []).extend(loose)
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def _matches(pattern: str, value: str) -> bool:
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return True  # a pattern Python cannot read: do not second-guess the value


def _examples(schema: dict[str, Any], description: str) -> dict[str, list[str]]:
    """Examples quoted for a schema's text parameters, in the tool's description or their own."""
    props = schema.get("properties") or {}
    strings = [k for k, v in props.items() if v.get("type", "string") == "string"]
    out = described_examples(description, strings) if description else {}
    for name, prop in props.items():
        own = described_examples(str(prop.get("description") or ""), [name]).get(name)
        if own:
            out[name] = own
    return out


def _tool_examples(tool: Any) -> dict[str, list[str]]:
    return _examples(tool.input_schema, tool.description or "")


# strings for common JSON-schema formats: well-formed, and the same on every run
_FORMATS = {
    "date-time": "2024-06-01T12:00:00Z",
    "date": "2024-06-01",
    "time": "12:00:00",
    "email": "alex@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "hostname": "example.com",
}


def _from_hint(description: str, rng: random.Random) -> str | None:
    """A value in the form a description names: "(HH:MM)", "YYYY-MM-DD", "ISO 8601"."""
    if re.search(r"\bHH:MM:SS\b", description):
        return f"{rng.randint(6, 21):02d}:{rng.choice([0, 15, 30, 45]):02d}:00"
    if re.search(r"\bHH:MM\b", description):
        return f"{rng.randint(6, 21):02d}:{rng.choice([0, 15, 30, 45]):02d}"
    if re.search(r"\bYYYY-MM-DD\b", description):
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if re.search(r"\bISO[ -]?8601\b", description, re.IGNORECASE):
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
    return None


class SchemaSampler:
    def __init__(self, rng: random.Random, pool: ValuePool, defs: dict[str, Any] | None = None):
        self.rng = rng
        self.pool = pool
        self.defs = defs or {}
        self.examples: dict[str, list[str]] = {}  # from the tool's description, per parameter

    def arguments(
        self,
        schema: dict[str, Any],
        fixed: dict[str, Any] | None = None,
        description: str = "",
        nested: bool = False,
    ) -> dict:
        """Arguments for a tool's input schema; `fixed` ones are used as given. Examples quoted
        in the tool's `description` or a parameter's own are preferred for strings, then those
        other tools give for parameters of the same kind. `nested`: an object inside the
        arguments, which keeps the tool's `$defs` and examples."""
        if not nested:
            self.defs = schema.get("$defs", schema.get("definitions", {}))
            own = _examples(schema, description)
            self.examples = {
                name: list(dict.fromkeys(own.get(name, []) + self.pool.examples_for(name)))
                for name in schema.get("properties") or {}
            }
        required = set(schema.get("required", []))
        args = dict(fixed or {})
        for name, prop in (schema.get("properties") or {}).items():
            if name in args:
                continue
            if name not in required and self.rng.random() > 0.25:
                continue
            value = self.value(prop, name)
            for _ in range(5):  # two text arguments (from_unit, to_unit) should differ
                if not isinstance(value, str) or value not in args.values():
                    break
                value = self.value(prop, name)
            if value is not SKIP:
                args[name] = value
        return args

    def for_tool(self, tool: Any, fixed: dict[str, Any] | None = None) -> dict:
        """Arguments for a `ToolInfo`: its input schema, with its description's examples; a
        text parameter that takes SQL or an arithmetic expression gets one (`sql_query`,
        `expression`)."""
        fixed = dict(fixed or {})
        props = tool.input_schema.get("properties") or {}
        shown = _tool_examples(tool)  # a quoted example ('5 m to km') says the form best
        for name, prop in props.items():
            if name in fixed or shown.get(name):
                continue
            kind = free_text_kind(tool, name, prop)
            if kind == "sql":
                fixed[name] = self.sql_query(tool.description)
            elif kind == "expression":
                fixed[name] = self.expression()
            elif kind == "expressions":
                fixed[name] = [self.expression() for _ in range(self.rng.randint(1, 2))]
        return self.arguments(tool.input_schema, fixed, description=tool.description)

    def expression(self) -> str:
        """An arithmetic expression a person might ask a calculator for."""
        r = self.rng.randint
        forms = [
            lambda: f"{r(12, 99)} * {r(3, 19)}",
            lambda: f"{r(100, 999)} + {r(100, 999)}",
            lambda: f"{r(200, 999)} - {r(10, 199)}",
            lambda: f"({r(10, 60)} + {r(10, 60)}) * {r(2, 9)}",
            lambda: f"{r(2, 9) * r(10, 40)} / {r(2, 9)}",
            lambda: f"{r(2, 5)} ** {r(2, 8)}",
        ]
        return self.rng.choice(forms)()

    def sql_query(self, description: str = "") -> str:
        """A read-only SQL query: the tables first, then whole tables the server listed."""
        if self.pool.tables and self.rng.random() < 0.85:
            return f"SELECT * FROM {self.rng.choice(self.pool.tables)} LIMIT {SQL_ROWS}"
        if "sqlite" in description.lower() or self.rng.random() < 0.5:
            return "SELECT name FROM sqlite_master WHERE type = 'table'"
        return (
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        )

    def value(self, schema: dict[str, Any], name: str = "") -> Any:
        schema = self._resolve(schema)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [o for o in schema[key] if self._resolve(o).get("type") != "null"]
                return self.value(self.rng.choice(options), name) if options else None
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        if "const" in schema:
            return schema["const"]
        if schema.get("examples"):
            return self.rng.choice(schema["examples"])
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind in ("integer", "number"):
            return self._number(schema, name, integer=kind == "integer")
        if kind == "array":
            return self._array(schema, name)
        if kind == "object":
            return self.arguments(schema, nested=True)
        return self._string(schema, name)

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            return self.defs.get(ref.rsplit("/", 1)[-1], {})
        return schema

    def _number(self, schema: dict[str, Any], name: str, integer: bool) -> float:
        integer = integer or _counts(schema, name)  # whole whichever branch draws it
        default = schema.get("default")
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        if numeric and self.rng.random() < 0.5:
            return int(default) if integer else default
        seen = self.pool.observed(name, numeric=True)
        if seen and self.rng.random() < 0.8:
            value = self.rng.choice(seen)
            return int(value) if integer else value
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        if name.lower() in _SMALL_INT_NAMES:
            lo, hi = max(lo or 2, 2), min(hi or 4, 5)
        lo = 1 if lo is None else lo
        hi = max(lo + 1, 120 if hi is None else hi)
        if integer or self.rng.random() < 0.6:
            value: float = self.rng.randint(int(lo) + ("exclusiveMinimum" in schema), int(hi))
        else:
            value = round(self.rng.uniform(lo, hi), self.rng.choice([1, 2]))
        return int(value) if integer else value

    def _array(self, schema: dict[str, Any], name: str) -> list[Any]:
        items = self._resolve(schema.get("items", {}))
        if _is_id_name(name.rstrip("s")) and self.pool.ids:
            k = min(len(self.pool.ids), self.rng.randint(2, 4))
            return self.rng.sample(self.pool.ids, k)
        lo = max(1, schema.get("minItems", 1))
        hi = max(lo, min(schema.get("maxItems", 3), 3))
        out: list[Any] = []
        for _ in range(4 * hi):
            value = self.value(items, name.rstrip("s"))
            if value not in out:
                out.append(value)
            if len(out) >= hi:
                break
        return out[: max(lo, self.rng.randint(lo, hi))]

    def _string(self, schema: dict[str, Any], name: str) -> str:
        """A string for the schema; one that matches its `pattern` where it has one (a value
        the server showed if one fits, else one drawn from the pattern itself)."""
        value = self._plain_string(schema, name)
        pattern = schema.get("pattern")
        if not isinstance(pattern, str) or _matches(pattern, value):
            return value
        shown = self.examples.get(name, []) + self.pool.observed(name, numeric=False)
        fitting = [v for v in shown if isinstance(v, str) and _matches(pattern, v)]
        if fitting:
            return self.rng.choice(fitting)
        try:
            return rstr.Rstr(self.rng).xeger(pattern)
        except Exception:  # a pattern rstr cannot read: the call will say what it wants
            return value

    def _plain_string(self, schema: dict[str, Any], name: str) -> str:
        if self.pool.paths and set(name_words(name)) & _PATH_WORDS:
            return self.rng.choice(self.pool.paths)
        if self.pool.tables and "table" in name_words(name):
            return self.rng.choice(self.pool.tables)
        if _is_id_name(name) and self.pool.ids:
            return str(self.rng.choice(self.pool.ids))
        if isinstance(schema.get("default"), str) and schema["default"]:
            return schema["default"]
        if self.examples.get(name):
            return _vary_numbers(self.rng.choice(self.examples[name]), self.rng)
        if schema.get("format") in _FORMATS:
            return _FORMATS[schema["format"]]
        hinted = _from_hint(str(schema.get("description") or ""), self.rng)
        if hinted is not None:
            return hinted
        seen = [v for v in self.pool.observed(name, numeric=False) if isinstance(v, str)]
        if seen and self.rng.random() < (0.9 if name in self.pool.by_key else 0.5):
            return self.rng.choice(seen)
        if name in ("query", "search", "q", "keyword"):
            words = self.pool.phrases + self.pool.learned or _FALLBACK_PHRASES
        else:
            words = self.pool.phrases + _FALLBACK_PHRASES
        words = [p for p in words if len(p.split()) <= 3]
        phrase = self.rng.choice(words)
        if name in ("body", "text", "content", "description", "message"):
            return f"Remember: {phrase}, then follow up by Friday."
        if name in ("tag", "tags", "label", "category"):
            return phrase.split()[-1].lower()
        if name in ("title",):
            return phrase.capitalize()
        return phrase.lower() if name in ("query", "search", "q", "keyword") else phrase
