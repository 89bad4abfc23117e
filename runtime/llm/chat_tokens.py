"""Tokenize a rendered chat so that only the template's own markers become special tokens.

Asked to parse special tokens, llama.cpp first splits its input at the text of
every special token (longest first) and then tokenizes the text between them.
Tokenizing a whole rendered conversation that way lets a message that contains
``<|im_end|><|im_start|>system`` forge a turn. Here the same split is done in
Python over the template's own text only (llama-vocab.cpp,
``tokenizer_st_partition``), and each run of text between two markers, template
text and message content together, is tokenized as plain text. For messages that
hold no control token's text, the ids are exactly those of tokenizing the whole
rendering with special tokens parsed (tests/runtime/test_chat_injection.py holds
this against llama.cpp on two template families).

Content is told from template text by rendering with placeholders
(:meth:`ChatTemplate.render_parts`). A template that trims content is handled; one
that rewrites it otherwise (``content.split('</think>')[-1]``) is tokenized whole,
and refused if a message holds a control token's text.

User-defined tokens (Gemma's whitespace runs and HTML tags, for example) are
vocabulary, not control: llama.cpp matches them even in plain text, as Hugging Face
tokenizers match added tokens, and so they are matched in content too.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.backends.base import LLMBackend, SpecialToken
from runtime.errors import BadInput

C_SPACE = " \t\n\v\f\r"  # C isspace(): what llama.cpp's lstrip/rstrip attributes absorb

Part = tuple[str, bool]  # (text, is message content)


class ChatTokenizer:
    def __init__(self, backend: LLMBackend) -> None:
        self.backend = backend
        self.specials: Sequence[SpecialToken] = backend.special_tokens()
        self._by_id = {t.id: t for t in self.specials}

    def partition(self, text: str, specials: Sequence[SpecialToken] | None = None) -> list[str | int]:
        """``text`` split into plain-text pieces and special-token ids, as llama.cpp splits it.

        ``specials``: a subset known to hold every special token in ``text`` (default: all).
        """
        frags: list[str | int] = [text] if text else []
        for tok in self.specials if specials is None else specials:  # longest first
            if tok.text not in text:
                continue
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    continue
                start = 0
                while (at := frag.find(tok.text, start)) >= 0:
                    left = frag[start:at].rstrip(C_SPACE) if tok.lstrip else frag[start:at]
                    if left:
                        out.append(left)
                    out.append(tok.id)
                    start = at + len(tok.text)
                    while tok.rstrip and start < len(frag) and frag[start] in C_SPACE:
                        start += 1
                if start < len(frag):
                    out.append(frag[start:])
            frags = out
        return frags

    def encode(self, parts: Sequence[Part], *, add_bos: bool) -> list[int]:
        """Token ids: special tokens only from the template's text (``False`` parts), content as plain text."""
        template_text = "\0".join(text for text, is_content in parts if not is_content)
        present = [t for t in self.specials if t.text in template_text]  # one scan of the vocabulary's specials, not one per part
        pieces: list[int | Part] = []
        for text, is_content in parts:
            if is_content:
                pieces.append((text, True))
                continue
            pieces.extend(frag if isinstance(frag, int) else (frag, False) for frag in self.partition(text, present))
        # BOS where the vocabulary asks for it (an EOS that add_eos vocabularies append is left out: no chat model sets it).
        ids = self.backend.tokenize("", add_bos=True, special=False)[:1] if add_bos else []
        run: list[str] = []
        for piece in [*pieces, None]:
            if isinstance(piece, tuple):
                run.append(piece[0])
                continue
            if run:
                ids += self.backend.tokenize("".join(run), add_bos=False, special=False)
                run = []
            if piece is not None:
                ids.append(piece)
        return ids

    def encode_chat(self, text: str, parts: Sequence[Part], exact: bool, *, add_bos: bool) -> list[int]:
        """Token ids of a rendered chat (see :meth:`ChatTemplate.render_parts`).

        When the template rewrites content, the content cannot be cut out of ``text``;
        the whole text is then tokenized with special tokens parsed, but only if no
        message holds a control token's text and ``text`` holds exactly the control
        tokens that the template wrote itself. Otherwise it is refused.
        """
        if exact:
            return self.encode(parts, add_bos=add_bos)
        own = [m for t, is_content in parts if not is_content for m in self._controls(t)]
        found = next((tok.text for t, is_content in parts if is_content for tok in self.specials if tok.control and tok.text in t), None)
        if found is None and self._controls(text) == own:
            return self.encode([(text, False)], add_bos=add_bos)
        what = f"a message contains the control token {found!r}" if found else "its control tokens change with the content"
        raise BadInput(
            "this model's chat template rewrites message content (beyond trimming whitespace) and "
            f"{what}: refusing rather than letting message text become control tokens"
        )

    def _controls(self, text: str) -> list[int]:
        return [f for f in self.partition(text) if isinstance(f, int) and self._by_id[f].control]
