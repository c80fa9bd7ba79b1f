"""Evaluation on a split: teacher-forced loss and token accuracy, free-running exact match."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Sequence

import torch

from tformer.config import SPEECH_TASKS, Config, DecodeConfig
from tformer.data.speech import error_rates
from tformer.data import Example, Tokenizer, Vocab, collate, model_lengths, token_budget_batches
from tformer.errors import ConfigError, DataError
from tformer.inference import translate_ids
from tformer.languages import Directions
from tformer.metrics import TranslationScores, exact_match, translation_scores
from tformer.model import Transformer
from tformer.results import Evaluation
from tformer.training.loss import generator_loss

if TYPE_CHECKING:
    from tformer.api import Translator

EVAL_LOGITS = 1 << 24  # floats of logits built at once when scoring (64 MiB; a 32k vocabulary: 512 positions)


@torch.inference_mode()
def teacher_forced(model: Transformer, examples: list[Example], cfg: Config) -> dict[str, float]:
    """Loss (label-smoothed, per token), nll, perplexity and token accuracy over `examples`."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src_lens, tgt_lens = model_lengths(examples, cfg.model.frame_rate)
    batches = token_budget_batches(src_lens, tgt_lens, max(cfg.train.max_tokens, int(src_lens.max(initial=0)), int(tgt_lens.max(initial=0))),
                                   shuffle=False)
    loss = nll = correct = total = 0.0
    for idx in batches:
        b = collate([examples[i] for i in idx], idx, Vocab.pad, Vocab.bos, Vocab.eos).to(device)
        hidden = model(b.src, b.src_lengths, b.tgt_in, b.tgt_lengths).real()  # (N, D)
        target = b.tgt_out[b.tgt_out != Vocab.pad]  # (N,)
        rows = max(1, EVAL_LOGITS // model.generator.out_features)  # the logits of this many positions at once
        for r in range(0, len(target), rows):
            out = generator_loss(hidden[r : r + rows], model.generator, target[r : r + rows],
                                 cfg.train.label_smoothing, Vocab.pad)
            loss, nll, total = loss + float(out.loss), nll + float(out.nll), total + float(out.n_tokens)
            correct += out.correct
    model.train(was_training)
    return {"loss": loss / total, "nll": nll / total, "ppl": math.exp(min(nll / total, 50.0)),
            "token_acc": correct / total}


def evaluate(model: Transformer, examples: list[Example], cfg: Config, free_running: bool = True,
             decode: DecodeConfig | None = None, references: list[str] | None = None,
             tokenizer: Tokenizer | None = None, forced: bool = True, directions: Directions | None = None
             ) -> tuple[dict[str, float], list[list[int]]]:
    """Teacher-forced metrics (unless `forced` is False: an ensemble has no one loss) plus, if asked,
    free-running decoding (`decode`, else cfg.decode) scored by whole-sequence exact match or, given
    `references` and the target `tokenizer`, by sacreBLEU, chrF and tokenized BLEU of the detokenised output
    (speech tasks: character and word error rates). A multilingual split (`directions`) is decoded at once and
    scored per direction (`direction_scores`). Returns the metrics and the hypotheses (ids)."""
    metrics = teacher_forced(model, examples, cfg) if forced else {}
    hyps: list[list[int]] = []
    if free_running:
        prefixes = [list(t[:1]) for _, t in examples] if tagged_targets(cfg) else None  # the target's token first
        hyps = [n[0] for n in translate_ids(model, [s for s, _ in examples], decode or cfg.decode, prefixes).tokens]
        if references is None:
            metrics["exact_match"] = exact_match(hyps, [t for _, t in examples])
        else:
            if tokenizer is None:
                raise DataError("scoring against references needs the target tokenizer")
            texts = [tokenizer.decode(h) for h in hyps]
            if cfg.data.task in SPEECH_TASKS:
                metrics.update(error_rates(texts, references))
            elif directions is not None:
                metrics.update(direction_scores(texts, references, directions))
            else:
                metrics.update(translation_scores(texts, references, cfg.data.tgt_lang).as_dict())
    metrics["n"] = len(examples)
    return metrics, hyps


def tagged_targets(cfg: Config) -> bool:
    """Whether each prepared target starts with its language's token (data.tag_sides both, data.pairs):
    decoding is then given it, as a request gives it (tformer.languages)."""
    return bool(cfg.data.pairs) and cfg.data.tag_sides == "both"


def direction_scores(texts: list[str], references: list[str], directions: Directions, compound_split: bool = False
                     ) -> dict[str, float]:
    """BLEU, chrF and tokenized BLEU of each direction ('bleu_en-fr', scored in its target language) and their
    means over the directions ('bleu': each direction counts alike, whatever its size)."""
    per = {name: s.as_dict() for name, s in per_direction(texts, references, directions, compound_split).items()}
    out = {f"{k}_{name}": v for name, scores in per.items() for k, v in scores.items()}
    keys = set.intersection(*(set(scores) for scores in per.values())) if per else set()
    out.update({k: sum(scores[k] for scores in per.values()) / len(per) for k in sorted(keys)})
    return out


def per_direction(texts: list[str], references: list[str], directions: Directions, compound_split: bool = False
                  ) -> dict[str, TranslationScores]:
    """Each direction's scores with their signatures (`compound_split`: into German also with compounds split)."""
    out = {}
    for name in directions.names:
        idx = directions.members(name).tolist()
        tgt = name.split("-")[1]
        if idx:
            out[name] = translation_scores([texts[i] for i in idx], [references[i] for i in idx], tgt,
                                           compound_split=compound_split and tgt == "de")
    return out


def evaluate_split(t: "Translator", split: str, decode: DecodeConfig, pairs: Sequence[str] | None = None
                   ) -> Evaluation:
    """`Translator.evaluate`: a split of the model's data (a multilingual model's: `pairs`, else its own)."""
    cfg = t.config
    t.shortlist(decode)  # checked against the vocabularies
    data = t.load_split(split, pairs)
    sources, refs = data.texts[split]
    speech = cfg.data.task in SPEECH_TASKS
    directions = data.directions.get(split)
    tic = time.perf_counter()
    metrics, hyps = evaluate(t.model, data.examples[split], cfg, decode=decode, references=refs if speech else None,
                             tokenizer=t.target_tokenizer, forced=not t.ensemble)
    seconds = time.perf_counter() - tic
    outputs = [t.decode(h) for h in hyps]
    scores, per = None, {}
    if cfg.data.task == "translation" and directions is not None:
        per = per_direction(outputs, refs, directions, compound_split=True)
        metrics.update(direction_scores(outputs, refs, directions, compound_split=True))
    elif cfg.data.task == "translation":
        scores = translation_scores(outputs, refs, cfg.data.tgt_lang, compound_split=cfg.data.tgt_lang == "de")
        metrics.update(scores.as_dict())
    return Evaluation(split, metrics, sources, refs, outputs, decode, seconds, scores, per)


@torch.inference_mode()
def ponder_steps(model: Transformer, examples: list[Example], max_tokens: int = 4096) -> tuple[list[list[int]], list[list[int]]]:
    """ACT steps per source token and per target token (teacher-forced, which equals decoding: the cache
    is exact) of a universal transformer; one list per example, </s> and <s> included."""
    if model.cfg.kind != "universal":
        raise ConfigError("ponder steps exist only for model.kind=universal")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src_lens, tgt_lens = model_lengths(examples, model.cfg.frame_rate)
    src_steps: list[list[int]] = [[] for _ in examples]
    tgt_steps: list[list[int]] = [[] for _ in examples]
    for idx in token_budget_batches(src_lens, tgt_lens, max(max_tokens, int(src_lens.max(initial=0)), int(tgt_lens.max(initial=0))), shuffle=False):
        b = collate([examples[i] for i in idx], idx, Vocab.pad, Vocab.bos, Vocab.eos).to(device)
        enc, dec = model(b.src, b.src_lengths, b.tgt_in, b.tgt_lengths).ponder
        for row, i in enumerate(idx):
            src_steps[i] = enc.steps[row, : int(src_lens[i])].long().tolist()
            tgt_steps[i] = dec.steps[row, : int(tgt_lens[i])].long().tolist()
    model.train(was_training)
    return src_steps, tgt_steps
