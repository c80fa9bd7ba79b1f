"""tformer: Transformer sequence-to-sequence models in PyTorch: train, evaluate, translate, inspect, serve.

    import tformer

    translator = tformer.load("runs/m30k")                           # a run folder or a checkpoint folder
    translator.translate(["A dog runs on the beach ."], beam=5)[0].text
    translator.score(["A dog ."], ["Ein Hund ."])[0].log_prob
    result = tformer.train(tformer.Config.from_yaml("copy", ["train.max_steps=500"]), "runs/copy")

The names below are the public API (tformer.api, tformer.training.start, tformer.config, tformer.errors); they
are imported on first use, so `import tformer` and the command line start quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "load": "tformer.api", "Translator": "tformer.api", "Translation": "tformer.api", "Hypothesis": "tformer.api",
    "Score": "tformer.api", "Evaluation": "tformer.api", "build_model": "tformer.api",
    "train": "tformer.training.start", "prepare": "tformer.training.start", "TrainResult": "tformer.training.loop",
    "Config": "tformer.config", "ModelConfig": "tformer.config",
    "DataConfig": "tformer.config", "TrainConfig": "tformer.config", "DecodeConfig": "tformer.config",
    "TformerError": "tformer.errors", "ConfigError": "tformer.errors", "DataError": "tformer.errors",
    "CheckpointError": "tformer.errors", "TrainingError": "tformer.errors",
}
__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:  # for readers and type checkers; at run time __getattr__ imports on first use
    from tformer.api import Evaluation, Hypothesis, Score, Translation, Translator, build_model, load
    from tformer.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig
    from tformer.errors import CheckpointError, ConfigError, DataError, TformerError, TrainingError
    from tformer.training.loop import TrainResult
    from tformer.training.start import prepare, train


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # found directly next time
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
