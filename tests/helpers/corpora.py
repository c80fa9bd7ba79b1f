"""The offline corpora (../shared/data, or $TFORMER_SHARED_DATA) and small real slices of them."""

import gzip
import os
from pathlib import Path

from helpers import ROOT

SHARED_DATA = Path(os.environ.get("TFORMER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def small_multi30k(shared: Path, out: Path, n_train: int = 3000, n_eval: int = 200,
                   names: dict[str, str] | None = None) -> Path:
    """The first lines of Multi30k train/val/test2016 (real text, gzip like the originals) in `out`. `names`:
    the languages to take, each with the suffix its files get (default en and de as they are; {"en": "en_XX",
    "fr": "fr_XX"} names them as a model's language codes)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_eval), ("test2016", n_eval)):
        for lang, name in (names or {"en": "en", "de": "de"}).items():
            with gzip.open(shared / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(out / f"{split}.{name}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    return out
