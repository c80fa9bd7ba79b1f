"""The per-sentence inputs a decoding rule may read besides the source: lists of target phrases, one list (or
None) per sentence. Each is declared once here, and every entry point reads the declaration: the keyword of
`Translator.translate`, the field of /v1/translate and its schema, the `tformer translate` option, the
shortlist's kept tokens. A rule that needs a new kind of phrase adds one `PhraseInput` to `PHRASE_INPUTS`."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.decode.constraints import MAX_PHRASES


@dataclass(frozen=True)
class PhraseInput:
    name: str  # translate(name=...), the /v1/translate field, `tformer translate --name-file`
    help: str  # one sentence: what every output does with these phrases
    max_phrases: int  # per sentence
    strategies: tuple[str, ...]  # the searches that enforce it (decode.strategy); others refuse it
    written: bool  # True: outputs must be able to write its tokens (a lexical shortlist keeps them)


PHRASE_INPUTS: tuple[PhraseInput, ...] = (
    PhraseInput("constraints", "target phrases every output must hold (lexically constrained beam search)",
                MAX_PHRASES, ("beam",), True),
)

Phrases = dict[str, list[list[list[int]] | None]]  # input name -> per sentence, its phrases as id lists (or None)


def phrase_input(name: str) -> PhraseInput:
    for p in PHRASE_INPUTS:
        if p.name == name:
            return p
    raise KeyError(f"no phrase input {name!r}; there are {', '.join(p.name for p in PHRASE_INPUTS)}")
