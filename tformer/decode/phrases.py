"""The per-sentence inputs a decoding rule may read besides the source: lists of target phrases, one list (or
None) per sentence. The rule that reads one declares it (`Rule.phrase`, a `PhraseInput`); `PHRASE_INPUTS`
gathers the declarations of the rules in decode.rules.ORDER, and every entry point reads it: the keyword of
`Translator.translate`, the field of /v1/translate and its schema, the `tformer translate` option, the
shortlist's kept tokens. A rule that needs a new kind of phrase declares it: nothing here changes."""

from __future__ import annotations

from tformer.decode.common import PhraseInput, Phrases
from tformer.decode.rules import PHRASE_INPUTS, phrase_input

__all__ = ["PHRASE_INPUTS", "PhraseInput", "Phrases", "phrase_input"]
