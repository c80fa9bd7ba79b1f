"""Scores as pure functions: token accuracy and exact match (synthetic tasks), sacreBLEU, chrF and
tokenized BLEU (translation)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import Tensor

from tformer.errors import DataError


def token_accuracy(logits: Tensor, target: Tensor, pad: int) -> tuple[int, int]:
    """(correct, total) over non-pad positions; logits (N, V), target (N,)."""
    real = target != pad
    return int(((logits.argmax(-1) == target) & real).sum()), int(real.sum())


def exact_match(hypotheses: list[list], references: list[list]) -> float:
    """Fraction of hypotheses equal to their reference as whole sequences."""
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        return 0.0
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)


@dataclass
class TranslationScores:
    bleu: float  # sacreBLEU: detokenised, cased, 13a tokenisation
    chrf: float
    tok_bleu: float  # BLEU on Moses-tokenised text, cased (multi-bleu.perl style, as papers report it)
    bleu_signature: str
    chrf_signature: str
    tok_bleu_signature: str
    # BLEU on the same Moses tokens lowercased (multi-bleu.perl -lc), as Multi30k / multimodal MT papers report it
    tok_bleu_lc: float
    tok_bleu_lc_signature: str
    # tokenized BLEU after compound splitting (`split_compounds`), as WMT14 en-de papers report it; only when
    # asked for (translation_scores(..., compound_split=True)), else None
    tok_bleu_compound: float | None = None
    tok_bleu_compound_signature: str | None = None

    def as_dict(self) -> dict[str, float]:
        d = {"bleu": self.bleu, "chrf": self.chrf, "tok_bleu": self.tok_bleu, "tok_bleu_lc": self.tok_bleu_lc}
        if self.tok_bleu_compound is not None:
            d["tok_bleu_compound"] = self.tok_bleu_compound
        return d


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokenisation (sacremoses, no escaping): what multi-bleu.perl users feed it."""
    from sacremoses import MosesTokenizer

    mt = MosesTokenizer(lang=lang)
    return [mt.tokenize(line, escape=False, return_str=True) for line in lines]


# perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' as tensor2tensor's get_ende_bleu.sh runs it: on the UTF-8 bytes
# (no -C), so \S is "not ASCII whitespace" (a no-break space is not whitespace there), $1 and $2 are single
# bytes, and the search resumes after $2, which may be the first byte of a character: `ä-ö-ü` splits at both
# hyphens (ö is two bytes), `a-b-c` only at the first. re.sub on the same bytes does exactly that.
_COMPOUND = re.compile(rb"(\S)-(\S)")


def split_compounds(line: str) -> str:
    """A hyphen between two non-space characters becomes ` ##AT##-##AT## ` (Vaswani et al. 2017 and
    tensor2tensor's get_ende_bleu.sh apply it to Moses-tokenised hypotheses and references before multi-bleu).
    Matches never overlap, on bytes as in perl: `a-b-c` -> `a ##AT##-##AT## b-c`, but `a-ö-c` splits twice."""
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", line.encode("utf-8")).decode("utf-8")


def translation_scores(hypotheses: list[str], references: list[str], lang: str = "en", *,
                       compound_split: bool = False) -> TranslationScores:
    """Corpus sacreBLEU and chrF (with their signatures) and tokenized BLEU, cased and lowercased, of
    detokenised hypotheses against one reference each. `lang` is the target language, for the Moses tokenizer.
    With `compound_split`, also tokenized BLEU after `split_compounds` on both sides (`tok_bleu_compound`).

    Lowercased tokenized BLEU lowercases the Moses tokens (tokenize, then lowercase: the tokens of `tok_bleu`,
    so it is never below it), as `multi-bleu.perl -lc` on tokenised text does, but with Python's full Unicode
    `str.lower()` (sacreBLEU's `case:lc`, Moses' lowercase.perl): multi-bleu.perl reads bytes, so its `lc`
    leaves non-ASCII capitals (Ä, Ö, Ü, É) as they are."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    tok, tok_lc = BLEU(tokenize="none", force=True), BLEU(tokenize="none", lowercase=True, force=True)
    tok_hyps, tok_refs = moses_tokenize(hypotheses, lang), moses_tokenize(references, lang)
    t = tok.corpus_score(tok_hyps, [tok_refs])
    t_lc = tok_lc.corpus_score(tok_hyps, [tok_refs])  # lowercases both sides, then splits on whitespace
    moses = f"|moses:{lang}"
    tok_signature = str(tok.get_signature()) + moses  # ...|case:mixed|...|moses:de
    scores = TranslationScores(bleu=b.score, chrf=c.score, tok_bleu=t.score, bleu_signature=str(bleu.get_signature()),
                               chrf_signature=str(chrf.get_signature()), tok_bleu_signature=tok_signature,
                               tok_bleu_lc=t_lc.score, tok_bleu_lc_signature=str(tok_lc.get_signature()) + moses)
    if compound_split:
        tc = tok.corpus_score([split_compounds(h) for h in tok_hyps], [[split_compounds(r) for r in tok_refs]])
        scores.tok_bleu_compound = tc.score
        scores.tok_bleu_compound_signature = tok_signature + "|compound:##AT##"
    return scores
