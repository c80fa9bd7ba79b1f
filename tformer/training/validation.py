"""Validation during training: the model decodes the validation split (greedy, or a beam of train.valid_beam)
and is scored as `tformer evaluate` scores it (tformer.evaluation): BLEU and chrF for translation, CER and WER
for speech, exact match for the synthetic tasks, with the teacher-forced loss, perplexity and token accuracy.
With a moving average of the weights (train.ema) the average is scored, and chooses the best checkpoint; the
raw weights' scores come beside it as raw_*. Which validation is better is the run-folder format's ranking
(tformer.checkpoint.validation_key), so that `best` and the checkpoints kept by train.keep_best agree.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

from tformer.checkpoint import validation_key
from tformer.config import Config
from tformer.data.tokenizer import Tokenizer
from tformer.evaluation import evaluate
from tformer.languages import Directions
from tformer.model import Transformer
from tformer.training.ema import EMA

log = logging.getLogger("tformer")


def validate(model: Transformer, examples: list, cfg: Config, references: Sequence[str] | None,
             tokenizer: Tokenizer, ema: EMA | None = None, directions: Directions | None = None) -> dict[str, Any]:
    """The validation metrics of `model` on `examples` (`references`: the raw target texts that BLEU or CER are
    computed against; None for the synthetic tasks), and the seconds they took (eval_seconds). A multilingual
    split (`directions`) is scored per direction too; with train.best_direction, `selection` is that direction's
    BLEU, which chooses the best checkpoint instead of the mean (`validation_key`)."""
    decode = dataclasses.replace(cfg.decode, strategy="greedy" if cfg.train.valid_beam == 1 else "beam",
                                 beam_size=cfg.train.valid_beam, nbest=1)
    tic = time.perf_counter()

    def score() -> dict[str, Any]:
        return evaluate(model, examples, cfg, decode=decode, references=references, tokenizer=tokenizer,
                        directions=directions)[0]

    metrics = score()
    if ema is not None:  # the average is what the best checkpoint is chosen by; the raw weights beside it
        with ema.swapped_in(model):
            metrics = {**score(), **{f"raw_{k}": v for k, v in metrics.items()}}
    if cfg.train.best_direction:
        metrics["selection"] = metrics[f"bleu_{cfg.train.best_direction}"]
    metrics["eval_seconds"] = time.perf_counter() - tic
    return metrics


def better(metrics: dict[str, Any], best: dict[str, Any] | None) -> bool:
    """A better validation than the best so far (`validation_key`)."""
    return best is None or validation_key(metrics) > validation_key(best)


def report(metrics: dict[str, Any], step: int) -> None:
    """The log line of a validation: the task's scores (and the raw weights' beside a moving average's)."""
    scores = (f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}" if "bleu" in metrics
              else f"CER {metrics['cer']:.2f}%  WER {metrics['wer']:.2f}%" if "cer" in metrics
              else f"exact match {metrics['exact_match']:.4f}")
    if "raw_loss" in metrics:
        scores += "  (moving average; raw weights: " + (
            f"BLEU {metrics['raw_bleu']:.2f})" if "bleu" in metrics else f"CER {metrics['raw_cer']:.2f}%)"
            if "cer" in metrics else f"exact match {metrics['raw_exact_match']:.4f})")
    names = [k[5:] for k in metrics if k.startswith("bleu_")]
    if names:  # many directions: BLEU each, then the mean
        scores = "BLEU " + "  ".join(f"{n} {metrics['bleu_' + n]:.2f}" for n in names) + "  mean " + scores[5:]
    log.info("valid step %d: loss %.4f  ppl %.3f  token acc %.4f  %s  (%.0f s)", step, metrics["loss"],
             metrics["ppl"], metrics["token_acc"], scores, metrics["eval_seconds"])
