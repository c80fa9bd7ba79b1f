"""Training curves from a run's metrics.jsonl: loss, validation score, learning rate, tokens/s (and ponder)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from tformer.errors import DataError  # noqa: E402

SCORES = (("bleu", "BLEU"), ("chrf", "chrF"), ("exact_match", "exact match"), ("cer", "CER %"), ("wer", "WER %"))


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl; a line cut short by a crash is skipped, any other bad line is an error."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist: give a run folder (one that `tformer train` wrote)") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); is it a tformer metrics.jsonl?") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # the last record, cut short mid-write
                continue
            raise DataError(f"{path}:{n}: not a JSON record") from None
        if not isinstance(record, dict) or "step" not in record or "kind" not in record:
            raise DataError(f"{path}:{n}: not a tformer metrics record (needs 'kind' and 'step')")
        records.append(record)
    if not records:
        raise DataError(f"{path} has no records yet: training logs one every train.log_every updates")
    return records


def plot_curves(metrics: str | Path, path: str | Path | None = None):
    """One figure, a panel per quantity, updates on the x axis. Returns (figure, {panel title: {line label:
    (steps, values)}}): the data each line was drawn from."""
    records = read_metrics(metrics)
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    panels: dict[str, dict[str, tuple[list, list]]] = {}

    def line(panel: str, label: str, rows: list[dict], key: str) -> None:
        rows = [r for r in rows if isinstance(r.get(key), (int, float))]
        if rows:
            panels.setdefault(panel, {})[label] = ([r["step"] for r in rows], [r[key] for r in rows])

    line("loss (label-smoothed, per token)", "train", train, "loss")
    line("loss (label-smoothed, per token)", "validation", valid, "loss")
    for key, name in SCORES:
        line("validation score", name, valid, key)
    line("learning rate", "lr", train, "lr")
    line("source + target tokens / s", "tokens/s", train, "tok_per_s")
    line("mean ACT steps per position", "ponder", train, "ponder")
    n = len(panels)
    cols = 2
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.0 * rows), squeeze=False)
    for ax, (title, lines) in zip(axes.flat, panels.items()):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("update", fontsize=8)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{Path(metrics)}", fontsize=9)
    fig.tight_layout()
    if path is not None:
        from tformer.viz.attention import save_figure

        save_figure(fig, path)
    return fig, panels
