"""The training loop: a Trainer builds (or restores) a run's model, optimizer, batches and state, then takes
updates, validating and checkpointing as configured, until a limit stops it.

    tformer.training.step         one optimizer update (accumulation, clipping, NaN/inf skipped), the optimizer
    tformer.training.validation   the validation split decoded and scored; which validation is better
    tformer.training.progress     metrics.jsonl, TensorBoard, the progress bar and the log lines
    tformer.checkpoint            the run folder it writes and resumes from

The batch order is a pure function of (seed, epoch), and a checkpoint records the TrainerState (the epoch
and the cursor in it among the rest), the optimizer and the RNG: `resume` continues exactly where the run
stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm  # the text bar: tqdm.auto warns in a notebook without ipywidgets

from tformer.checkpoint import (CheckpointError, NoCheckpointError, check_room, list_checkpoints, load_checkpoint,
                                load_tokenizers, resolve_checkpoint, save_checkpoint, save_tokenizers)
from tformer.config import SPEECH_TASKS, Config, same_architecture, save_config
from tformer.convert import open_checkpoint
from tformer.data import Batch, load_task
from tformer.errors import ConfigError, TformerError, TrainingError, option
from tformer.model import build_model
from tformer.training import distributed, limits, threads as cpu_threads
from tformer.training.batches import Batches, SubwordSampling, prefetch
from tformer.training.compile import CompiledForward, cache_dir as compile_cache_dir
from tformer.training.distributed import Context
from tformer.training.ema import EMA
from tformer.training.precision import Precision
from tformer.training.progress import RunLog, Window, show, summary_writer_class
from tformer.training.schedule import learning_rate
from tformer.training.state import TrainerState
from tformer.training.step import build_optimizer, take_update
from tformer.training.step import train_step_loss  # noqa: F401  (imported from here by tests and the tutorials)
from tformer.training.validation import better, report, validate

log = logging.getLogger("tformer")


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    best: dict[str, Any] | None  # validation metrics of the best checkpoint
    elapsed: float  # wall seconds, evaluations included, over all sessions of this run
    reached_target: bool
    interrupted: bool = False  # stopped by Ctrl-C (after saving a checkpoint)
    stopped_by: str = ""  # the limit that ended the run, as its setting ('train.max_steps=3000'); '' if interrupted
    shortfall: str = ""  # a run with train.target_exact_match that ended short of it: why, and how to train on


class _StopOnSigint:
    """First Ctrl-C: finish the current update, save, stop. Second: abort at once."""

    def __init__(self) -> None:
        self.requested = False
        self._old = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("Ctrl-C: stopping after this update and saving a checkpoint (Ctrl-C again aborts)")

    def __enter__(self) -> "_StopOnSigint":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def train(cfg: Config, run_dir: str | Path, resume: bool = False, progress: bool = False) -> TrainResult:
    """Train `cfg` into `run_dir`, or continue it (`resume`). Under torchrun (WORLD_SIZE > 1) every process
    calls this; see tformer.training.distributed."""
    ctx = distributed.setup(cfg.train.device)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    if cfg.train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS asks for
        torch.use_deterministic_algorithms(True)
    elif cfg.train.compile:  # inductor's sums by atomic adds differ from run to run (training/compile.py)
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        if not ctx.main:
            log.setLevel(logging.WARNING)  # one voice: rank 0 logs
        return Trainer(cfg, Path(run_dir), resume, progress and ctx.main, ctx).run()
    finally:
        torch.set_num_threads(threads)  # train.threads is this run's, not the caller's for good
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        distributed.teardown(ctx)


class Trainer:
    """One training session of a run: builds (or restores) everything, then `run` loops over updates,
    evaluating and checkpointing as configured. Its whole progress is `self.state` (a TrainerState)."""

    def __init__(self, cfg: Config, run_dir: Path, resume: bool, progress: bool, ctx: Context) -> None:
        t = self.t = cfg.train
        self.cfg, self.run_dir, self.progress, self.ctx = cfg, run_dir, progress, ctx
        if t.threads:
            torch.set_num_threads(t.threads)
        if t.tensorboard:
            summary_writer_class()  # fail before any work when the package is missing
        ckpt, self.restarted = self._checkpoint_to_resume(resume)
        init = open_checkpoint(t.init_from) if t.init_from and ckpt is None else None  # fine-tuning starts here
        torch.manual_seed(t.seed)
        data = _load_data(cfg, run_dir, ckpt or init, ctx, progress, save=ckpt is None)
        self.tokenizers = data.tokenizers
        self.train_examples, self.valid_examples = data.examples["train"], data.examples["valid"]
        self.valid_refs = data.texts["valid"][1] if cfg.data.task in ("translation", *SPEECH_TASKS) else None
        sampling = (SubwordSampling(data.texts["train"], data.tokenizers, cfg.data.subword_sampling)
                    if cfg.data.subword_sampling else None)
        self.valid_directions = data.directions.get("valid")
        self.batches = Batches(self.train_examples, cfg, ctx, sampling,  # planned before the model (its temporaries)
                               data.directions.get("train"))
        self.model = build_model(cfg.model, len(data.src_vocab), len(data.tgt_vocab)).to(ctx.device)
        if cfg.model.cmvn and data.feature_stats is not None:  # a checkpoint's own statistics replace these below
            self.model.src_embed.set_cmvn(*(s.to(ctx.device) for s in data.feature_stats))
        distributed.broadcast_parameters(ctx, self.model)
        if ctx.rank:  # dropout masks differ between processes (rank 0 keeps the single-process stream)
            torch.manual_seed(t.seed + 1_000_003 * ctx.rank)
        self.optimizer = build_optimizer(self.model, cfg)
        self.amp = Precision(t.precision, ctx.device)
        self.forward = CompiledForward(self.model, ctx.device) if t.compile else self.model  # what updates call
        self.state = TrainerState()
        if ckpt:
            ckpt.load_model_state(self.model, "raw")
            ckpt.load_training_state(self.optimizer, ctx.rank, self.model)
            self.state = TrainerState.of(ckpt)
            self.amp.load(self.state.grad_scaler)
            log.info("resumed from %s (step %d, epoch %d, update %d of %d in it)", ckpt.path, self.state.step,
                     self.state.epoch, self.state.cursor, self.batches.per_epoch)
        elif init is not None:
            if not same_architecture(init.cfg.model, cfg.model):
                raise ConfigError(f"train.init_from={t.init_from}: not its model (build the config with train_config)")
            init.load_model_state(self.model)  # the weights inference would use (a moving average when kept)
            log.info("fine-tuning from %s", t.init_from)
        self.ema = EMA.resume(self.model, t.ema, ckpt) if t.ema else None  # restored, or started now
        self.state.ema_updates = 0 if self.ema is None else self.ema.updates
        self.resumed = ckpt is not None
        self.last_eval_step = self.state.step if ckpt else -1
        self.window = Window()
        if ctx.main:
            save_config(cfg, run_dir / "config.yaml")
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("model: %s parameters; train %d, valid %d examples; run folder %s%s", f"{n_params:,}",
                 len(self.train_examples), len(self.valid_examples), run_dir,
                 f"; {ctx.world} processes ({ctx.device.type}), {ctx.world} x {t.accum_steps} batches per update"
                 if ctx.enabled else "")

    def _checkpoint_to_resume(self, resume: bool):
        run_dir, ckpt, restart = self.run_dir, None, False
        if resume:
            try:
                ckpt = load_checkpoint(run_dir, which="latest")
            except NoCheckpointError:  # stopped (or killed) before its first checkpoint: nothing to continue from
                if not run_dir.is_dir():
                    raise
                restart = True
                log.warning("%s holds no complete checkpoint yet (the run stopped before its first): starting it "
                            "from the beginning", run_dir)
        elif (run_dir / "checkpoints").is_dir() and list_checkpoints(run_dir / "checkpoints"):
            raise CheckpointError(f"{run_dir} already holds checkpoints; add {option('resume', True)} to continue "
                                  f"it, or choose another {option('run_dir')}")
        if ckpt and ckpt.trainer.get("world_size", 1) != self.ctx.world:
            raise CheckpointError(f"{ckpt.path} was written by {ckpt.trainer.get('world_size', 1)} training "
                                  f"process(es), this run has {self.ctx.world}: resume with the same number "
                                  "(torchrun --nproc-per-node N), so the batches of each update stay the same")
        return ckpt, restart

    # ---------------------------------------------------------------------------------------- the loop

    def run(self) -> TrainResult:
        t, state, ctx = self.t, self.state, self.ctx
        ended = self._limit(state.elapsed) if self.resumed else ""
        if ended:  # resumed at an end it had reached: no update, no evaluation, nothing written
            log.info("the run already ended at step %d (%s): nothing to do; raise that limit to train on",
                     state.step, ended)
            latest = resolve_checkpoint(self.run_dir, "latest")
            return TrainResult(self.run_dir, latest, state.step, state.best, state.elapsed, state.reached_target,
                               stopped_by=ended, shortfall=self._shortfall(ended))
        self.run_log = RunLog(self.run_dir, ctx.main, t.tensorboard,
                              state.step if self.resumed or self.restarted else None)
        self.recorder = self._recorder()
        self.session_start, self.elapsed0 = time.perf_counter(), state.elapsed
        total = t.epochs * self.batches.per_epoch
        total = min(t.max_steps, total) if t.max_steps else total
        bar = tqdm(total=total, initial=min(state.step, total), disable=not self.progress, unit="step",
                   dynamic_ncols=True)
        self.model.train()
        self.clock = limits.Clock(state.step, total, self.batches.per_epoch)
        sharing = cpu_threads.Sharing()
        sharing.start()
        stop = interrupted = False
        limit = ""
        with _StopOnSigint() as sigint, bar, self.run_log:
            while state.epoch < t.epochs and not stop:
                updates = prefetch(self.batches.updates(state.epoch, state.cursor))
                try:
                    for micro in updates:
                        self._take(micro)
                        bar.update(1)
                        self._log(bar)
                        estimate = self.clock.updated(state.step, self.t, self._elapsed())
                        if estimate:
                            log.info("%s", estimate)
                            self._advise_threads(sharing)
                        if state.cursor == 0 and not t.eval_every:  # the epoch ended
                            self._timed_evaluate()
                        elif t.eval_every and state.step % t.eval_every == 0:
                            self._timed_evaluate()
                        elif t.save_every and state.step % t.save_every == 0:
                            self.checkpoint(None)
                        # every process stops at the same update: the flags of all of them count
                        limit = self._limit(self._elapsed())
                        interrupted, limited = distributed.any_rank(ctx, sigint.requested, bool(limit))
                        stop = interrupted or limited
                        if limit:
                            log.info("%s reached at step %d", limit, state.step)
                        if stop or state.cursor == 0:
                            break
                finally:
                    updates.close()
            if interrupted:
                path = self.checkpoint(None)
                log.warning("interrupted at step %d: saved %s; continue with %s", state.step, path,
                            option("resume", True))
                return TrainResult(self.run_dir, path, state.step, state.best, state.elapsed, False, interrupted=True,
                                   shortfall=self._shortfall(""))
            if self.last_eval_step != state.step:
                self.evaluate()
            latest = self.checkpoint(None)  # still under the Ctrl-C guard: a Ctrl-C now lets it finish
        shortfall = self._shortfall(limit)  # `limit`: the one the last update reached (the last epoch's included)
        if shortfall:
            log.warning("%s", shortfall)
        elif limit and not t.target_exact_match:
            log.info("%s", limits.stopped(limit, t, state, self.run_dir))
        return TrainResult(self.run_dir, latest, state.step, state.best, state.elapsed, state.reached_target,
                           stopped_by=limit, shortfall=shortfall)

    def _advise_threads(self, sharing: cpu_threads.Sharing) -> None:
        """Warn when other processes leave fewer cores than torch has threads (training on a CPU)."""
        if self.ctx.device.type != "cpu":
            return
        tip = cpu_threads.advice(torch.get_num_threads(), sharing.others(), cpu_threads.cores(),
                                 os.environ.get("OMP_WAIT_POLICY"))
        if tip:
            log.warning("%s", tip)

    def _timed_evaluate(self) -> None:
        tic = time.perf_counter()
        self.evaluate()
        self.clock.evaluated(time.perf_counter() - tic)

    def _shortfall(self, limit: str) -> str:
        return limits.shortfall(limit, self.t, self.state, self.run_dir)

    def _take(self, micro: list[Batch]) -> None:
        """One update over this process's batches `micro`; the state advances whether it was taken or skipped."""
        state = self.state
        self.lr = learning_rate(state.step + 1, self.t, self.cfg.model.d_model)
        tic = time.perf_counter()
        ok = take_update(self.forward, self.optimizer, micro, self.lr, self.t, self.window, self.ctx, self.amp,
                         state.step + 1)
        if isinstance(self.forward, CompiledForward) and self.forward.just_compiled():
            log.info("train.compile: the first update took %.1f s, compiling included; inductor keeps the code in "
                     "%s for the next run", time.perf_counter() - tic, compile_cache_dir())
        state.advance(self.batches.per_epoch)
        if ok:
            state.bad_updates = 0
            if self.ema is not None:
                self.ema.update()
                state.ema_updates = self.ema.updates
        else:
            self._bad_update()

    def _log(self, bar: tqdm) -> None:
        state, window = self.state, self.window
        if not ((state.step % self.t.log_every == 0 or state.step == 1) and window.tgt):
            return
        epoch = state.epoch - (state.cursor == 0)  # the epoch this update belonged to
        rec = {"kind": "train", "step": state.step, "epoch": epoch, "lr": self.lr, **window.flush(),
               "elapsed": round(self._elapsed(), 2)}
        self.run_log.write(rec)
        show(rec, bar, to_log=not self.progress)

    def _elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.session_start

    def _limit(self, elapsed: float) -> str:
        """The limit the run has reached after `elapsed` seconds of training ('' if none): what the loop stops
        on, and what a resumed run checks before it takes an update."""
        t, state = self.t, self.state
        return next((why for why, reached in (
            (f"train.max_steps={t.max_steps}", t.max_steps and state.step >= t.max_steps),
            (f"train.epochs={t.epochs}", state.epoch >= t.epochs),
            (f"train.max_hours={t.max_hours:g}", t.max_hours and elapsed >= t.max_hours * 3600),
            (f"train.target_exact_match={t.target_exact_match:g}", t.target_exact_match and state.reached_target),
            (f"train.patience={t.patience}", t.patience and state.bad_evals >= t.patience)) if reached), "")

    def _recorder(self):
        if not (self.t.attention_examples and self.ctx.main):
            return None
        from tformer.viz.record import AttentionRecorder

        recorder = AttentionRecorder(self.run_dir, self.valid_examples, self.tokenizers, self.t.attention_examples)
        if self.resumed:
            recorder.truncate(self.state.step)
        else:
            recorder.truncate(0)  # a restart drops what the stopped attempt recorded
            recorder.record(self.model, 0)  # the untrained model: the first frame of the animations
        return recorder

    # ---------------------------------------------------------------------------------------- saving

    def _finite_weights(self) -> bool:
        return bool(torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all())

    def checkpoint(self, metrics: dict[str, Any] | None) -> Path:
        """Every process calls this (their random states are gathered); rank 0 writes. Weights that are no
        longer finite are never saved over the last good checkpoint."""
        state, ctx = self.state, self.ctx
        if not self._finite_weights():
            raise TrainingError(f"training stopped at step {state.step}: the weights are no longer finite (an "
                                "update with a finite gradient overflowed them: the learning rate is far too high); "
                                f"nothing was saved, the last checkpoint in {self.run_dir / 'checkpoints'} is intact. "
                                f"Lower train.lr and continue with {option('resume', True)}")
        best = False
        if metrics is not None and better(metrics, state.best):
            state.best, state.best_step, best = metrics, state.step, True
        if metrics is not None:
            state.bad_evals = 0 if best else state.bad_evals + 1
        state.elapsed = self._elapsed()
        state.grad_scaler = self.amp.state()
        rng = distributed.gather_rng(ctx)
        path = self.run_dir / "checkpoints" / f"step_{state.step:07d}"
        if ctx.main:
            info = {**state.to_json(), **({"valid": metrics} if metrics else {})}  # this checkpoint's validation
            path = save_checkpoint(self.run_dir, state.step, self.model, self.optimizer, info, self.cfg,
                                   self.tokenizers, best=best, keep_last=self.t.keep_last, rng_states=rng,
                                   ema=None if self.ema is None else self.ema.state(), keep_best=self.t.keep_best)
        distributed.barrier(ctx)
        return path

    def _bad_update(self) -> None:
        """An update skipped for a NaN/inf loss or gradient: warn; stop after train.max_bad_updates in a row."""
        state, t = self.state, self.t
        state.bad_updates += 1
        state.skipped_updates += 1
        n, at = state.bad_updates, state.step
        log.warning("step %d: the loss or the gradients are NaN/inf; update skipped, weights unchanged (%d in a "
                    "row, the limit is train.max_bad_updates=%d)", at, n, t.max_bad_updates)
        if n < t.max_bad_updates:
            return
        why = (f"training stopped at step {at}: the loss or the gradients were NaN/inf in {n} updates in a row "
               f"(steps {at - n + 1}-{at}), each skipped. ")
        if self._finite_weights():
            path = self.checkpoint(None)
            why += f"The weights are still finite (from before those updates): saved {path}. "
        else:
            why += (f"The weights themselves are no longer finite, so nothing was saved; the last checkpoint in "
                    f"{self.run_dir / 'checkpoints'} is intact. ")
        raise TrainingError(why + "Usual causes: a learning rate too high for the model (train.lr, train.warmup), "
                            "no gradient clipping (train.clip_norm), fp16 overflow (train.precision=bf16 or fp32), "
                            f"or a corrupt batch; change one and continue with {option('resume', True)}")

    # ---------------------------------------------------------------------------------------- evaluating

    def evaluate(self) -> dict[str, Any]:
        """Every process calls this; rank 0 evaluates, the others wait and receive the outcome."""
        state, ctx, t = self.state, self.ctx, self.t
        self.last_eval_step = state.step
        metrics: dict[str, Any] = self._evaluate_on_main() if ctx.main else {}
        self.checkpoint(metrics if ctx.main else None)
        if ctx.enabled:
            shared, metrics = distributed.broadcast_object(ctx, (state.to_json(), metrics))
            for key, value in shared.items():  # in place: the loop holds this object
                setattr(state, key, value)
        if t.patience and state.bad_evals >= t.patience:  # the loop stops on it (`_limit`)
            log.info("no better validation %s in %d evaluations: stopping early (best: step %s)",
                     "BLEU" if "bleu" in metrics else "CER" if "cer" in metrics else "score", t.patience,
                     state.best_step)
        self.model.train()
        return metrics

    def _evaluate_on_main(self) -> dict[str, Any]:
        state = self.state
        metrics = validate(self.model, self.valid_examples, self.cfg, self.valid_refs, self.tokenizers[1], self.ema,
                           self.valid_directions)
        if self.recorder is not None:
            self.recorder.record(self.model, state.step)
        if self.t.target_exact_match and metrics.get("exact_match", 0.0) >= self.t.target_exact_match:
            state.reached_target = True
        epoch = state.epoch - (state.cursor == 0 and state.step > 0)
        self.run_log.write({"kind": "valid", "step": state.step, "epoch": epoch, "elapsed": round(self._elapsed(), 2),
                            **{k: round(v, 6) for k, v in metrics.items()}})
        report(metrics, state.step)
        return metrics


def _load_data(cfg: Config, run_dir: Path, ckpt, ctx: Context, progress: bool = False, save: bool = True):
    """Rank 0 reads the data (training the tokenizers of a new run) and writes the tokenizers into the run
    folder, which it creates only now (a bad corpus leaves nothing behind); the other processes then read
    the data with those tokenizers. A problem on rank 0 stops every process with its message."""
    kwargs = dict(joint=cfg.model.share_embeddings, feature_dim=cfg.model.feature_dim)
    splits = ("train", "valid")
    if ctx.main:
        try:
            data = load_task(cfg.data, splits, tokenizers=ckpt.tokenizers if ckpt else None, progress=progress,
                             **kwargs)
            with torch.device("meta"):  # the parameter count, without allocating the model
                n_params = sum(p.numel() for p in build_model(cfg.model, len(data.src_vocab),
                                                               len(data.tgt_vocab)).parameters())
            check_room(run_dir, n_params, cfg.train.keep_last)  # before anything is written
            if save:  # a new run (a resumed one has them already)
                run_dir.mkdir(parents=True, exist_ok=True)
                save_tokenizers(data.tokenizers, run_dir)
        except Exception as e:  # the others raise the same class: a user's mistake stays one, a bug stays a bug
            kind = type(e) if isinstance(e, TformerError) else ValueError
            distributed.broadcast_object(ctx, (kind, f"{type(e).__name__}: {e}"))
            raise
        distributed.broadcast_object(ctx, None)
        return data
    problem = distributed.broadcast_object(ctx, None)
    if problem is not None:
        kind, why = problem
        raise kind(f"rank 0 could not read the data ({why})")
    return load_task(cfg.data, splits, tokenizers=ckpt.tokenizers if ckpt else load_tokenizers(run_dir), **kwargs)
