"""What tformer.api returns (translations, scores, evaluations) and the lines the command line writes and reads
for them: Moses n-best and Marian alignment lines, `tformer score`'s tsv/jsonl, 'source<TAB>target' pairs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tformer.config import DecodeConfig
from tformer.errors import ConfigError, DataError
from tformer.inspection import AttentionMaps
from tformer.metrics import TranslationScores

SCORE_FORMATS = ("tsv", "jsonl")
Alignment = list[tuple[int, int]]  # (source piece index, target piece index), 0-based, </s> on neither side


@dataclass(frozen=True)
class Hypothesis:
    text: str  # detokenised
    tokens: list[str]  # the target pieces, without <s> and </s>
    score: float  # beam: log-probability / GNMT length penalty; greedy: log-probability; sampling: under the
    # distribution sampled from (temperature, top-k/top-p cut, renormalised)
    attention: AttentionMaps | None = None  # with return_attention=True (teacher-forced on this output)
    alignment: Alignment | None = None  # with alignment=True: per target piece, its source piece (see translate)


@dataclass(frozen=True)
class Translation:
    """One source's translation: its n-best hypotheses, best first; `text`, `tokens`, `score`, `attention`
    and `alignment` are the best one's."""

    source_tokens: list[str]  # the source pieces the model read (empty for frames and empty sources)
    hypotheses: list[Hypothesis]

    text = property(lambda self: self.hypotheses[0].text)
    tokens = property(lambda self: self.hypotheses[0].tokens)
    score = property(lambda self: self.hypotheses[0].score)
    attention = property(lambda self: self.hypotheses[0].attention)
    alignment = property(lambda self: self.hypotheses[0].alignment)


@dataclass(frozen=True)
class Score:
    """Forced decoding of one (source, target) pair."""

    log_prob: float  # the sum of token_log_probs: log P(target </s> | source)
    tokens: list[str]  # the target pieces, then '</s>'
    token_log_probs: list[float]  # one per token, aligned with `tokens`
    attention: AttentionMaps | None = None
    alignment: Alignment | None = None  # with alignment=True: over the target pieces, not '</s>'


@dataclass(frozen=True)
class Evaluation:
    split: str
    metrics: dict[str, float]  # loss, nll, ppl, token_acc, n; bleu/chrf/tok_bleu/tok_bleu_lc, cer/wer or exact_match
    sources: list[str]  # source sentences (utterance ids for speech)
    references: list[str]
    outputs: list[str]  # detokenised best hypotheses
    decode: DecodeConfig  # the settings decoding used
    seconds: float  # wall time of the evaluation
    scores: TranslationScores | None = None  # translation: the scores with their sacreBLEU signatures
    directions: dict[str, TranslationScores] = field(default_factory=dict)  # a multilingual model: per direction


def format_alignment(alignment: Alignment) -> str:
    """'0-0 1-2 2-1': (source, target) index pairs as Marian and fast_align write them."""
    return " ".join(f"{s}-{t}" for s, t in alignment)


def format_translation(translation: Translation, index: int, nbest: bool, alignment: bool = False) -> str:
    """The output line(s) of one translation: its text, or with `nbest` one 'index ||| text ||| score' line
    per hypothesis (Moses' n-best format); with `alignment`, each line ends in ' ||| 0-0 1-2 ...'
    (Marian's 'translation ||| alignment')."""
    def tail(h: Hypothesis) -> str:
        return f" ||| {format_alignment(h.alignment or [])}" if alignment else ""

    if not nbest:
        return translation.text + tail(translation.hypotheses[0]) + "\n"
    return "".join(f"{index} ||| {h.text} ||| {h.score:.4f}{tail(h)}\n" for h in translation.hypotheses)


def format_score(score: Score, format: str = "tsv", pieces: bool = False) -> str:
    """The output line of one scored pair. 'tsv': the total log-probability, a tab, the per-token
    log-probabilities separated by spaces (the target's pieces, then </s>; 4 decimals), then with `pieces`
    a tab and those tokens, and when the score has an alignment a tab and the alignment ('0-0 1-2').
    'jsonl': {"log_prob", "tokens", "token_log_probs"[, "alignment": [[source, target], ...]]} in full
    precision (`pieces` changes nothing: the tokens are always there)."""
    if format == "jsonl":
        record: dict[str, Any] = {"log_prob": score.log_prob, "tokens": score.tokens,
                                  "token_log_probs": score.token_log_probs}
        if score.alignment is not None:
            record["alignment"] = [list(pair) for pair in score.alignment]
        return json.dumps(record, ensure_ascii=False) + "\n"
    if format != "tsv":
        raise ConfigError(f"format must be one of {', '.join(SCORE_FORMATS)}; got {format!r}")
    fields = [f"{score.log_prob:.4f}", " ".join(f"{lp:.4f}" for lp in score.token_log_probs)]
    if pieces:
        fields.append(" ".join(score.tokens))
    if score.alignment is not None:
        fields.append(format_alignment(score.alignment))
    return "\t".join(fields) + "\n"


def parse_pair(line: str, where: str) -> tuple[str, str]:
    """A 'source<TAB>target' line -> (source, target); `where` (file and line) names it in errors."""
    tabs = line.count("\t")
    if tabs != 1:
        what = "no tab" if not tabs else f"{tabs} tabs"
        raise DataError(f"{where}: {what}; each line must be 'source<TAB>target' with exactly one tab (an empty "
                        "target, 'source<TAB>', scores </s> alone)")
    source, target = line.split("\t")
    return source, target
