"""Constrained decoding with xgrammar: which tokens may come next.

- `tool_choice` "required": exactly one call of an offered tool, its arguments valid against
  that tool's input schema; a named function: a call of that function, and with mcprl's
  `function.arguments` extension exactly those arguments (a demonstration: the tokens are the
  model's own spelling of the call, sampled under the pin); `allowed_tools`: as "required" or
  "auto" (its mode), over only the tools it names.
- "auto": free text, but once the model opens `<tool_call>`, the call must be valid.
- `response_format` json_schema: JSON valid against the schema; json_object: any JSON object.

Grammars are compiled once per distinct request shape (xgrammar caches them).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import Any

import torch
import xgrammar as xgr

from mcprl.errors import GrammarError
from mcprl.serving._chat import TOOL_CALL_BEGIN, TOOL_CALL_END

__all__ = ["CanonicalTokens", "GrammarError", "GrammarFactory"]


# A JSON number in a tool call has at most this many digits before its point, and
# MAX_FRACTION_DIGITS after it: a small model can otherwise write digits until its token limit
# (`"b": 29.3250011111111112311001113124999…`), ending the attempt with no call.
MAX_NUMBER_DIGITS = 12
# A float's shortest repr has at most 17 significant digits, so a result such as
# 37.285714285714285 can be copied whole. At 12 the copy hit the cap and the model, still
# wanting digits, wrote the exponent the grammar offered: `37.285714285714E+23` (gnomon-mcp,
# L90: 3 of its 6 val tasks failed only so).
MAX_FRACTION_DIGITS = 17
# An exponent has at most 3 digits: float64 ends at 1e308. A trained small model otherwise writes
# `79.795373999999E+6105`, which parses as infinity or fails the call.
MAX_EXPONENT_DIGITS = 3


def _arguments_grammar(schema: dict[str, Any]) -> str:
    """EBNF for a tool's arguments: its JSON schema, with numbers of bounded length."""
    return _bounded_ebnf(json.dumps(schema))  # key order kept: it is the arguments' order


@functools.lru_cache(maxsize=1024)  # the same tools come with every request of a run
def _bounded_ebnf(schema: str) -> str:
    # Compact JSON (`{"a": 1, "b": 2}`), as the chat template shows calls: free whitespace slots
    # are where a trained small model drifts (tabs before numbers), and its copying breaks there.
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    k, f, e = MAX_NUMBER_DIGITS, MAX_FRACTION_DIGITS, MAX_EXPONENT_DIGITS
    ebnf = ebnf.replace("[1-9] [0-9]*", f"[1-9] [0-9]{{0, {k - 1}}}")
    ebnf = re.sub(r"(\[eE\][^\n]*?_digits\)?\)?)\{1, -1\}", rf"\1{{1, {e}}}", ebnf)
    return re.sub(r"(_digits\)?\)?)\{1, -1\}", rf"\1{{1, {f}}}", ebnf)  # the fraction


def _pinned(arguments: Any) -> str:
    """EBNF for exactly `arguments`, spelled as compact JSON (`{"a": 7, "b": 9.48}`): the
    shortest spelling of each number, as a reference states it and as a call writes it. (A
    JSON-schema `const` spelled 9.48 as `9.4800000000000004`, which a demonstration then
    trained the model to write.)"""
    if not isinstance(arguments, dict):
        raise GrammarError(
            "tool_choice.function.arguments must be a JSON object of the call's arguments, "
            f"got {type(arguments).__name__}"
        )
    text = json.dumps(arguments, ensure_ascii=False)
    return 'root ::= "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tag(tool: dict[str, Any], grammar: str | None = None) -> dict[str, Any]:
    """A call of `tool`: its arguments valid against its schema, or matching `grammar`."""
    fn = tool.get("function", tool)
    schema = fn.get("parameters") or {"type": "object", "properties": {}}
    name = json.dumps(fn["name"], ensure_ascii=False)
    return {
        "type": "tag",
        "begin": f'{TOOL_CALL_BEGIN}\n{{"name": {name}, "arguments": ',
        "content": {"type": "grammar", "grammar": grammar or _arguments_grammar(schema)},
        "end": f"}}\n{TOOL_CALL_END}",
    }


class GrammarFactory:
    """Compiles request constraints for one tokenizer; thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
        self._lock = threading.Lock()

    def _structural(self, fmt: dict[str, Any]) -> xgr.CompiledGrammar:
        tag = json.dumps({"type": "structural_tag", "format": fmt})
        with self._lock:
            return self._compiler.compile_structural_tag(tag)

    def compile(
        self,
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        response_format: dict[str, Any] | None,
    ) -> xgr.CompiledGrammar | None:
        """The grammar for a request, or None when decoding is free."""
        try:
            return self._compile(tools, tool_choice, response_format)
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError for bad schemas
            raise GrammarError(f"cannot build a grammar from the given schema: {exc}") from exc

    def _compile(self, tools, tool_choice, response_format) -> xgr.CompiledGrammar | None:
        kind = (response_format or {}).get("type", "text")
        if kind == "json_schema":
            spec = response_format.get("json_schema") or {}
            schema = spec.get("schema", spec.get("schema_"))
            if not isinstance(schema, dict):
                raise GrammarError(
                    "response_format.json_schema.schema must be a JSON schema object"
                )
            with self._lock:
                # compact JSON: small models wander off in free whitespace
                return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        if kind == "json_object":
            with self._lock:
                return self._compiler.compile_builtin_json_grammar()
        if not tools or tool_choice == "none":
            return None
        if isinstance(tool_choice, dict) and tool_choice.get("type") == "allowed_tools":
            allowed = tool_choice["allowed_tools"]
            names = {(t.get("function") or {}).get("name") for t in allowed["tools"]}
            offered = {t.get("function", t).get("name") for t in tools}
            if unknown := sorted(str(n) for n in names - offered):
                raise GrammarError(
                    f"tool_choice.allowed_tools names {', '.join(map(repr, unknown))}, which "
                    "is not among the tools"
                )
            tools = [t for t in tools if t.get("function", t).get("name") in names]
            tool_choice = allowed["mode"]
        elif isinstance(tool_choice, dict):
            function = tool_choice.get("function") or {}
            wanted = function.get("name")
            chosen = [t for t in tools if t.get("function", t).get("name") == wanted]
            if not chosen:
                raise GrammarError(f"tool_choice names {wanted!r}, which is not among the tools")
            pinned = function.get("arguments")
            grammar = _pinned(pinned) if pinned is not None else None
            return self._structural(_tag(chosen[0], grammar))
        tags = [_tag(t) for t in tools]
        if tool_choice == "required":
            fmt = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
            return self._structural(fmt)
        return self._structural(  # "auto"
            {"type": "triggered_tags", "triggers": [TOOL_CALL_BEGIN], "tags": tags}
        )

    def matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)


class CanonicalTokens:
    """Keeps grammar-constrained sampling on the tokenizer's own spelling of the text.

    A grammar allows every token that spells a valid prefix, so a model can write a fixed name
    as fragments no tokenizer would produce: `complete_task` as `c`+`om`+`ple`+`te`+`_`+`task`,
    `}}` as `}`+`}`. The model is then conditioned on token sequences it never saw, at
    log-probabilities down to -24 (measured on SmolLM2-135M, in 70-100% of the tool calls of a
    training run), and GRPO trains on those.

    `respellings(matcher, token)` is None when `token` can stand as a token of the tokenizer's
    own encoding. Otherwise it lists the tokens that spell the same text and go on: the one that
    encodes the token with the text the grammar forces next (`multi` before `ply"`: `multiply`;
    `}` before `}`: `}}`), or, where the grammar branches and every character it allows next
    would merge (`c` before `o`), every longer token starting with its text (`co`, `convert`,
    `complete`...). The engine then writes one of those instead: the model's choice of text is
    kept, only its spelling changes. (Sampling again without the token instead made the model
    avoid `}}`, the only allowed end of a number, and write `26.000000011010E+268`.)
    Free text is left alone: where many tokens may follow, some next character keeps the token
    whole.

    The engine uses it only when asked (`Engine(canonical=True)`): on the
    calculator's default run it cut learning from +25.0 to +19.4 points (benchmarks/RESULTS.md). The
    trainer learns the respelled token at the model's own log-probability (`}}` at -8 to -11)
    while the model chose `}`, so what it chose is never reinforced.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_followers: int = 512) -> None:
        self.tokenizer = tokenizer
        self.max_followers = max_followers
        count = min(len(tokenizer), vocab_size)
        texts = tokenizer.batch_decode([[i] for i in range(count)])
        texts += [""] * (vocab_size - count)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        # each token's text and its first character; "" for special tokens, which merge with
        # nothing
        self._text = ["" if i in special else t for i, t in enumerate(texts)]
        self._first = [t[:1] for t in self._text]
        self._mask = xgr.allocate_token_bitmask(1, vocab_size)
        self._shifts = torch.arange(32, dtype=torch.int32)
        self.vocab_size = vocab_size
        self._whole: dict[int, bool] = {}
        self._first_token: dict[tuple[int, str], int] = {}
        self._longer: dict[int, list[int]] = {}

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _stands_alone(self, token: int) -> bool:
        """The token is its text's own encoding (the check below means nothing otherwise)."""
        if token not in self._whole:
            text = self._text[token]
            self._whole[token] = bool(text) and self._encode(text) == [token]
        return self._whole[token]

    def _leading(self, token: int, text: str) -> int:
        """The first token of the encoding of the token's text followed by `text`."""
        key = (token, text)
        if key not in self._first_token:
            if len(self._first_token) > 100_000:  # forced texts are few; bound a long-lived server
                self._first_token.clear()
            self._first_token[key] = self._encode(self._text[token] + text)[0]
        return self._first_token[key]

    def _extensions(self, token: int) -> list[int]:
        if token not in self._longer:
            text = self._text[token]
            self._longer[token] = [
                i for i, t in enumerate(self._text) if len(t) > len(text) and t.startswith(text)
            ]
        return self._longer[token]

    def respellings(self, matcher: xgr.GrammarMatcher, token: int) -> list[int] | None:
        if not self._stands_alone(token) or not matcher.accept_token(token):
            return None
        try:
            if matcher.is_terminated():
                return None
            forced = matcher.find_jump_forward_string()
            if forced:  # the text that must follow (`ply", "arguments": {"` after `multi`)
                leading = self._leading(token, forced)
                return None if leading == token else [leading]
            matcher.fill_next_token_bitmask(self._mask, 0)
            bits = (self._mask[0, :, None] >> self._shifts) & 1
            followers = bits.flatten()[: self.vocab_size].nonzero()[:, 0]
            if len(followers) > self.max_followers:
                return None
            chars = {self._first[i] for i in followers.tolist()}
            if "" in chars or any(self._leading(token, c) == token for c in chars):
                return None
            return self._extensions(token)
        finally:
            matcher.rollback(1)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)
