"""Training batches: planned once from the examples' lengths, collated ahead of the model on a thread."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from tformer.config import Config
from tformer.data import Batch, Example, Vocab, collate, model_lengths
from tformer.data.batching import BatchPlan
from tformer.languages import Directions, sampled
from tformer.training.distributed import Context

log = logging.getLogger("tformer")


class Batches:
    """The training batches: planned once from the examples' lengths (`BatchPlan`), each epoch's order a
    function of (seed, epoch); an update is `accum_steps x world` consecutive batches, of which this process
    takes every world-th. Collation runs ahead on a thread, so the model never waits for it; examples read
    from mapped files hand their pages back now and then."""

    RELEASE_EVERY = 256  # updates between handing mapped pages back

    def __init__(self, examples: Sequence[Example], cfg: Config, ctx: Context,
                 sampling: "SubwordSampling | None" = None, directions: Directions | None = None) -> None:
        t = cfg.train
        self.examples, self.seed, self.ctx, self.sampling = examples, t.seed, ctx, sampling
        src, tgt = model_lengths(examples, cfg.model.frame_rate)
        # data.pairs with a temperature: an epoch's examples, smaller directions repeated (languages.sampled)
        self.pool = None if directions is None else sampled(directions, cfg.data.temperature, t.seed)
        if self.pool is not None:
            src, tgt = src[self.pool], tgt[self.pool]
            drawn = np.bincount(directions.of[self.pool], minlength=len(directions.names))
            times = ", ".join(f"{name} x{k / n:.2f}" for (name, n), k in zip(directions.sizes().items(), drawn))
            log.info("directions drawn with temperature %g: %s examples an epoch (%s)", cfg.data.temperature,
                     f"{len(self.pool):,}", times)
        self.plan = BatchPlan(src, tgt, t.max_tokens, t.max_sentences)
        self.group = t.accum_steps * ctx.world
        self.per_epoch = -(-len(self.plan) // self.group)

    def updates(self, epoch: int, start: int) -> Iterator[list[Batch]]:
        """This process's batches of each update of `epoch`, from update `start` on, collated."""
        batches = self.plan.epoch(self.seed, epoch)
        release = getattr(self.examples, "release", None)
        for u in range(start, self.per_epoch):
            mine = range(u * self.group, min((u + 1) * self.group, len(batches)))[self.ctx.rank :: self.ctx.world]
            yield [self._collate(batches[b] if self.pool is None else self.pool[batches[b]], epoch, b) for b in mine]
            if release is not None and u % self.RELEASE_EVERY == self.RELEASE_EVERY - 1:
                release()

    def _collate(self, idx: Sequence[int], epoch: int, b: int) -> Batch:
        """Batch `b` of `epoch` (examples `idx`), re-segmented when subword sampling is on."""
        examples = (self.sampling.examples(idx, self.seed, epoch, b) if self.sampling is not None
                    else [self.examples[i] for i in idx])
        return collate(examples, idx, Vocab.pad, Vocab.bos, Vocab.eos)


class SubwordSampling:
    """`data.subword_sampling`: each training pair segmented afresh at every use from its text, by the
    SentencePiece model of its side with sampling on (BPE-dropout, or unigram sampling), seeded by (seed,
    epoch, batch): the same batch always gets the same pieces, so a resumed run continues exactly. The batch
    plan keeps the deterministic segmentation's lengths; a sampled one is longer (up to a few percent past
    train.max_tokens). The training texts are held in memory."""

    def __init__(self, texts: tuple[list[str], list[str]], tokenizers: tuple[Any, Any], alpha: float) -> None:
        self.sources, self.targets = texts
        self.tokenizers, self.alpha = tokenizers, alpha

    def examples(self, idx: Sequence[int], seed: int, epoch: int, b: int) -> list[Example]:
        state = np.random.SeedSequence([seed, epoch, b]).generate_state(2)  # one seed per side
        src = self.tokenizers[0].sample_batch([self.sources[i] for i in idx], self.alpha, int(state[0]))
        tgt = self.tokenizers[1].sample_batch([self.targets[i] for i in idx], self.alpha, int(state[1]))
        return list(zip(src, tgt))


def prefetch(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """`items`, produced up to `depth` ahead on a thread; its exceptions re-raised here. Closing the
    generator stops the thread."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(entry: tuple[bool, Any]) -> bool:
        """Hand `entry` over unless the consumer has stopped (then False)."""
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, done))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            put((False, e))

    thread = threading.Thread(target=fill, name="tformer-batches", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is done:
                return
            yield item
    finally:
        stop.set()
        thread.join()
