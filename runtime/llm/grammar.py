"""Constrained decoding: a grammar that every sampled token must keep valid.

A :class:`Grammar` travels in :class:`runtime.llm.sampling.SamplingParams`, so every sequence, the single stream's
and each engine slot's, gets it in its one sampler chain (``sampler_chain`` in runtime/backends/llamacpp.py puts
llama.cpp's grammar sampler first). There the grammar removes every token that would break it before the usual
samplers choose, so greedy and sampled output alike stay inside it, and an end-of-generation token is admitted only
where the grammar is complete. The grammar's state lives in the sampler, which a preempted sequence keeps, and
speculation samples each position with the same chain (sample and compare), so a drafted token the grammar
rejects is never accepted and greedy output is the same with speculation on and off.

The text is GBNF (llama.cpp's grammar format). It is bounded here (:data:`MAX_GBNF_BYTES`) and compiled by the
backend before a request is admitted (``check_grammar``): one that does not compile is refused as BadInput.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import BadInput

__all__ = ["JSON_OBJECT", "MAX_GBNF_BYTES", "Grammar", "gbnf", "literal"]

# A grammar is parsed by llama.cpp's C++ parser and walked at every decoded token: 64 KiB holds a schema of a few
# hundred properties (Home Assistant's 40-entity tool list converts to about 8 KiB) and keeps the parse small.
MAX_GBNF_BYTES = 64 * 1024


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar whose start rule is ``root``; ``what`` names it in errors and logs ("a JSON object")."""

    text: str
    what: str = "the grammar"

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise BadInput(f"{self.what} is empty: give GBNF text with a root rule (root ::= ...)")
        size = len(self.text.encode("utf-8", errors="surrogatepass"))
        if size > MAX_GBNF_BYTES:
            raise BadInput(f"{self.what} is {size} bytes; at most {MAX_GBNF_BYTES} are accepted")
        if "\x00" in self.text:
            raise BadInput(f"{self.what} contains a NUL character; GBNF is text")
        try:
            self.text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"{self.what} is not valid UTF-8 text (a lone surrogate)") from None


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def gbnf(text: object, where: str) -> Grammar:
    """A caller's own GBNF (the ``grammar`` field, ``--grammar FILE``): checked for type and size, compiled later."""
    if not isinstance(text, str):
        raise BadInput(f"{where} must be GBNF text (a string), got {type(text).__name__}")
    return Grammar(text, where)


# Any JSON object (OpenAI's response_format {"type": "json_object"}). Whitespace is bounded where it may go (one
# space, or a newline and up to 20 spaces or tabs of indent), so a model cannot spend its answer on blanks; strings
# hold no raw control characters; numbers are JSON's.
_JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws
array  ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] ) )* "\"" ws
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )? ws
ws     ::= ( " " | "\n" [ \t]{0,20} )?
"""

JSON_OBJECT = Grammar(_JSON_GBNF, "a JSON object")
