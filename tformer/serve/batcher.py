"""Cross-request batching: one model worker thread takes jobs from a queue and runs those that may share a
model call together.

    batcher = Batcher(max_wait=0.005, batch_tokens=4096, max_queue=512)
    future = batcher.submit(Job(run_group, plan, key=plan.key, sentences=len(plan), width=max(plan.widths)))
    batcher.cancel(job)        # a client gone or timed out: dropped if queued, abandoned if running
    batcher.close()            # finish every accepted job, then stop the thread

A job is some sentences with a `key`: jobs with equal keys can be decoded in one call (tformer serve's key is
the plan's, tformer.plan.Plan.key: the whole Decoding, one object compared whole), jobs with key None run
alone. The worker takes the oldest job, waits until `max_wait` seconds after it
arrived for more of its kind (unless the token budget is already full), then takes every queued job with
the same key, oldest first, while the padded source tokens (sentences x widest) stay within `batch_tokens`.
`run(group)` gets the jobs' payloads and returns one result per job; each result goes back through the
job's future. If a group call raises, each of its jobs is run alone so an error lands only on the job that
caused it. Outputs never depend on the grouping as long as `run` decodes every sentence with its job's own
settings (tformer's searches are batch-invariant: finished sentences leave the batch).

The queue is bounded by sentences: a job that would take more than `max_queue` waiting sentences is refused
at once (RequestError 503; an empty queue always takes one). Waiting is the caller's business: it holds a
concurrent.futures.Future and may give up on the job (`cancel`), which drops it if the worker has not started
it, and otherwise marks it `abandoned`: a runner that reads that flag while it works (tformer serve's pass it
to Translator.run as `cancelled`) takes the job's sentences out of the model call at its next decoding
step, and the other jobs of the group go on as they would have.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Hashable

from tformer.serve.requests import RequestError

log = logging.getLogger("tformer")

Runner = Callable[[list["Job"]], list[Any]]


@dataclass(eq=False)
class Job:
    """Work for the model: `run([job, ...])` computes the results of a group of jobs with this job's key."""

    run: Runner
    payload: Any
    key: Hashable | None = None  # equal keys may share a model call; None: alone
    sentences: int = 1  # what the queue bound counts
    width: int = 1  # the widest source (pieces + </s>): sentences x width is what the token budget counts
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    abandoned: bool = False  # given up on while running: its result is not wanted (runners may stop its work)


@dataclass
class Stats:
    """What the worker has done since it started."""

    jobs: int = 0  # answered (with a result or an error)
    sentences: int = 0
    batches: int = 0  # model calls (groups)
    dropped: int = 0  # cancelled before they started (client gone, timed out)
    abandoned: int = 0  # given up on while running (their sentences left the model call)
    largest_batch: int = 0  # sentences in the largest group


class Batcher:
    """A bounded queue of Jobs and the one thread that runs them (see the module docstring)."""

    def __init__(self, max_wait: float = 0.005, batch_tokens: int = 4096, max_queue: int = 512,
                 name: str = "tformer-model") -> None:
        self.max_wait = max_wait
        self.batch_tokens = batch_tokens
        self.max_queue = max_queue
        self.stats = Stats()
        self._queue: collections.deque[Job] = collections.deque()
        self._pending = 0  # sentences queued or running
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Sentences accepted and not yet answered (queued or being decoded)."""
        return self._pending

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue `job`; its future gets the result. Refused with a 503 RequestError when the queue is full or
        the batcher is closing."""
        with self._cond:
            if self._closing:
                raise RequestError("the server is shutting down; retry on another", HTTPStatus.SERVICE_UNAVAILABLE)
            if self._pending and self._pending + job.sentences > self.max_queue:
                raise RequestError(f"busy: {self._pending} sentences are waiting for the model (the limit is "
                                   f"{self.max_queue}, --max-queue); retry in a moment",
                                   HTTPStatus.SERVICE_UNAVAILABLE)
            self._pending += job.sentences
            job.queued_at = time.monotonic()
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def call(self, fn: Callable[[], Any], sentences: int = 1) -> concurrent.futures.Future:
        """Run `fn()` alone on the model thread (its result through the future)."""
        return self.submit(Job(lambda jobs: [fn()], None, None, sentences, 1))

    def cancel(self, job: Job) -> bool:
        """Drop `job` if it has not started (True); one already running is marked abandoned (False): its runner
        may stop its work, and its result is unread."""
        with self._cond:
            if not job.future.cancel():
                if not job.future.done() and not job.abandoned:
                    job.abandoned = True
                    self.stats.abandoned += 1
                return False
            try:
                self._queue.remove(job)
            except ValueError:  # already taken by the worker, which will see it cancelled
                return True
            self._pending -= job.sentences
            self.stats.dropped += 1
            self._cond.notify_all()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Stop taking jobs, finish those accepted, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---------------------------------------------------------------------------------------- the worker

    def _budget(self, jobs: list[Job]) -> int:
        return sum(j.sentences for j in jobs) * max((j.width for j in jobs), default=0)

    def _take(self) -> list[Job] | None:
        """The next group (removed from the queue), after waiting for company; None when closed and drained."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            first = self._queue[0]
            if first.key is not None and self.max_wait > 0:
                deadline = first.queued_at + self.max_wait
                while (not self._closing and not first.future.cancelled() and
                       self._budget([j for j in self._queue if j.key == first.key]) < self.batch_tokens):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._queue or self._queue[0] is not first:  # cancelled meanwhile: start again
                    return []
            group = [first]
            if first.key is not None:
                for job in list(self._queue)[1:]:
                    if job.key != first.key:
                        continue
                    if self._budget(group + [job]) > self.batch_tokens:
                        break
                    group.append(job)
            for job in group:
                self._queue.remove(job)
            return group

    def _loop(self) -> None:
        while (group := self._take()) is not None:
            live = [j for j in group if j.future.set_running_or_notify_cancel()]
            now = time.monotonic()
            for job in live:
                job.started_at = now
            with self._cond:  # cancelled since they were taken: they leave the count now
                self._pending -= sum(j.sentences for j in group if j not in live)
                self.stats.dropped += len(group) - len(live)
                self._cond.notify_all()
            if live:
                self._run(live)  # each job leaves the count as it is answered (_answer)

    def _run(self, group: list[Job]) -> None:
        try:
            results = group[0].run(group)
            assert len(results) == len(group), "a runner returns one result per job"
        except BaseException as e:  # noqa: BLE001: it goes back to the request(s); the worker goes on
            if len(group) > 1:  # find whose it is: each alone
                log.info("serve: a batch of %d requests failed (%s); answering each alone", len(group), e)
                for job in group:
                    self._run_alone(job)
                return
            self._answer(group, exception=e)
            return
        self._answer(group, results)

    def _run_alone(self, job: Job) -> None:
        try:
            result = job.run([job])[0]
        except BaseException as e:  # noqa: BLE001
            self._answer([job], exception=e)
            return
        self._answer([job], [result])

    def _answer(self, group: list[Job], results: list[Any] | None = None,
                exception: BaseException | None = None) -> None:
        """Deliver the results (or the exception). The jobs leave the pending count first: a client answered
        may send its next request at once, and finds room for it."""
        with self._cond:
            self.stats.batches += 1
            self.stats.jobs += len(group)
            n = sum(j.sentences for j in group)
            self.stats.sentences += n
            self.stats.largest_batch = max(self.stats.largest_batch, n)
            self._pending -= n
            self._cond.notify_all()
        for i, job in enumerate(group):
            if exception is not None:
                job.future.set_exception(exception)
            else:
                job.future.set_result(results[i])

    def snapshot(self) -> dict[str, Any]:
        """Queue and work counts (for /v1/info and /v1/health)."""
        with self._cond:
            return {"pending_sentences": self._pending, "queued_jobs": len(self._queue),
                    **dataclasses.asdict(self.stats)}
