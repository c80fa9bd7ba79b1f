"""Starting work from Python (the public API: tformer.train, tformer.prepare): `train` a model into a run
folder or continue one, the configuration it would run with (`train_config`), and `prepare` a corpus."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from tformer.checkpoint import load_checkpoint
from tformer.config import FINE_TUNABLE, Config
from tformer.errors import ConfigError, NoCheckpointError, option
from tformer.training.progress import bar, reporting


def train_config(config: Config | str | Path | None = None, run_dir: str | Path | None = None, *,
                 resume: bool = False, overrides: Sequence[str] = ()) -> Config:
    """The configuration `train` runs with these arguments (what `--print-config` shows). With train.init_from,
    the model section is the initial model's (`initial_model`)."""
    from tformer.config import ModelConfig, from_dict, load_config, merge_overrides, read_yaml, to_dict
    from tformer.recipes import find_recipe

    overrides = list(overrides)
    if resume and run_dir is None:
        raise ConfigError(f"resuming needs the run folder to continue ({option('run_dir')})")
    if isinstance(config, Config):
        cfg = from_dict(merge_overrides(to_dict(config), overrides)) if overrides else config
        given = {k: v for k, v in to_dict(cfg.model).items() if v != to_dict(ModelConfig())[k]}
        return initial_model(cfg, given, run_dir if resume else None) if cfg.train.init_from else cfg
    if config is not None:
        cfg = Config.from_yaml(config, overrides)
        given = dict(merge_overrides(read_yaml(find_recipe(config)), overrides).get("model") or {})
        return initial_model(cfg, given, run_dir if resume else None) if cfg.train.init_from else cfg
    if not resume:
        raise ConfigError("training needs a config: a tformer.Config, a YAML file or a recipe name such as "
                          f"'copy' ({option('config')})")
    try:
        return load_checkpoint(run_dir, which="latest", overrides=overrides).cfg
    except NoCheckpointError:  # stopped before its first checkpoint: the run folder's config restarts it
        if not (Path(run_dir) / "config.yaml").is_file():
            raise
        return load_config(Path(run_dir) / "config.yaml", overrides)


def initial_model(cfg: Config, given: dict, run_dir: str | Path | None = None) -> Config:
    """`cfg` with the model section of train.init_from's model (of the run's latest checkpoint when resuming
    `run_dir`: the initial model is not read again). `given`: the model keys the recipe or the overrides set;
    any but FINE_TUNABLE must equal the initial model's, else a ConfigError names the key. The initial model's
    tokenizers must suit the data settings."""
    import dataclasses

    from tformer.config import to_dict
    from tformer.convert import open_checkpoint

    start = None
    if run_dir is not None:
        try:
            start = load_checkpoint(run_dir, which="latest")
        except NoCheckpointError:  # stopped before its first checkpoint: it starts from the initial model again
            pass
    start = start or open_checkpoint(cfg.train.init_from)
    kinds = [getattr(t, "kind", type(t).__name__) for t in start.tokenizers]
    if cfg.data.task == "translation" and not set(kinds) <= {"subword", "pieces"}:
        raise ConfigError(f"train.init_from={cfg.train.init_from} reads text with {' and '.join(kinds)} tokenizers; "
                          "data.task 'translation' needs SentencePiece ones (a translation model, or an imported one)")
    if cfg.data.subword_sampling and "pieces" in kinds:
        raise ConfigError(f"config key 'data.subword_sampling': the imported model's tokenizers "
                          f"(train.init_from={cfg.train.init_from}) look pieces up in their own table and cannot "
                          "sample segmentations; set it to 0")
    have = to_dict(start.cfg.model)
    for key, value in given.items():
        if key not in FINE_TUNABLE and key in have and value != have[key]:
            raise ConfigError(f"config key 'model.{key}': fine-tuning (train.init_from={cfg.train.init_from}) keeps "
                              f"the initial model's architecture, whose {key} is {have[key]!r}, not {value!r}; leave "
                              f"model.{key} out (a fine-tuning run may set model.{', model.'.join(FINE_TUNABLE)})")
    tuned = {k: getattr(cfg.model, k) for k in FINE_TUNABLE if k in given}
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(start.cfg.model, **tuned))
    was = start.cfg.data
    if (was.languages or was.pairs) and cfg.data.pairs:  # its language tokens: their spelling, their sides
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, language_tag=was.language_tag,
                                                                 tag_sides=was.tag_sides))
    return cfg


def train(config: Config | str | Path | None = None, run_dir: str | Path | None = None, *, resume: bool = False,
          overrides: Sequence[str] = (), progress: bool | None = None):
    """Train a model into `run_dir`, or continue the run there (`resume=True`). `config`: a Config, or a
    YAML recipe (a path, or a packaged recipe's name such as 'copy'), with dotted `overrides` applied on top;
    to resume, it may be left out: the run's own configuration is used, overrides on top. Without
    `run_dir`, a new folder under runs/. Under torchrun every process calls this with the same arguments.
    Returns a TrainResult (run folder, latest checkpoint, step, best validation metrics, time, the limit that
    stopped it and, for a run short of train.target_exact_match, why and the override that trains on).
    `progress`: a progress bar (True) or log lines (False); None: as the command line, a bar in a terminal or a
    notebook, else lines. Either way the run reports as it goes (`reporting`)."""
    from tformer.training.loop import train as train_loop

    cfg = train_config(config, run_dir, resume=resume, overrides=overrides)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and run_dir is None:
        raise ConfigError(f"under torchrun, give the run folder ({option('run_dir')}): every process must write to "
                          "the same")
    if run_dir is None:
        stem = Path(config).stem if isinstance(config, (str, Path)) else "run"
        run_dir = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    with reporting():
        return train_loop(cfg, run_dir, resume=resume, progress=bar(progress))


def prepare(config: Config | str | Path, out: str | Path, *, overrides: Sequence[str] = (),
            splits: Sequence[str] = ("train", "valid", "test"), progress: bool | None = None):
    """Encode a translation corpus once into memory-mapped shards in `out` (`tformer prepare`): SentencePiece
    trained on a seeded sample of the training pairs (data.tokenizer_sample), every split encoded by
    data.workers processes. An interrupted prepare continues where it stopped when called again; a folder
    holding another corpus is refused. Train on it with data.prepared=OUT. Returns the PreparedCorpus.

    A speech corpus (data.task speech) gets its features instead: log-mel filterbanks of its audio (or its .npy
    frames) in float16/32 shards, with the training set's CMVN statistics (tformer.data.features); returns the
    PreparedFeatures. `progress` as for `train`."""
    from tformer.data.prepare import prepare as prepare_corpus

    cfg = train_config(config, overrides=overrides)
    with reporting():
        if cfg.data.task == "speech":
            from tformer.data.features import prepare_features

            return prepare_features(cfg.data, out, cfg.model.feature_dim, splits, progress=bar(progress))
        if cfg.data.task != "translation":
            raise ConfigError(f"tformer prepare writes translation and speech corpora; data.task '{cfg.data.task}' "
                              "is generated or read as it is")
        return prepare_corpus(cfg.data, out, splits, progress=bar(progress))
