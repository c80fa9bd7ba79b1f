"""Scores as pure functions: token accuracy and exact match (synthetic tasks), sacreBLEU, chrF and
tokenized BLEU (translation)."""

from __future__ import annotations

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

    def as_dict(self) -> dict[str, float]:
        return {"bleu": self.bleu, "chrf": self.chrf, "tok_bleu": self.tok_bleu}


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Moses tokenisation (sacremoses, no escaping): what multi-bleu.perl users feed it."""
    from sacremoses import MosesTokenizer

    mt = MosesTokenizer(lang=lang)
    return [mt.tokenize(line, escape=False, return_str=True) for line in lines]


def translation_scores(hypotheses: list[str], references: list[str], lang: str = "en") -> TranslationScores:
    """Corpus sacreBLEU and chrF (with their signatures) and tokenized BLEU of detokenised hypotheses
    against one reference each. `lang` is the target language, for the Moses tokenizer."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    tok = BLEU(tokenize="none", force=True)
    t = tok.corpus_score(moses_tokenize(hypotheses, lang), [moses_tokenize(references, lang)])
    return TranslationScores(b.score, c.score, t.score, str(bleu.get_signature()), str(chrf.get_signature()),
                             str(tok.get_signature()) + f"|moses:{lang}")
