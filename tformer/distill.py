"""Sequence-level knowledge distillation's first step (Kim & Rush, 2016): a teacher (a tformer run, an ensemble,
an imported OPUS-MT folder: any Translator) translates a training corpus, and a student then learns from the
teacher's outputs instead of the references.

    report = distill_corpus(teacher, "train.en", "distilled", references="train.de", beam=5, nbest=4)
    # distilled/train.en, distilled/train.de: the sources and the teacher's translations, line by line

The sources are read and translated `chunk_size` lines at a time, and each chunk's translations are written to
`parts/` under a temporary name, then renamed: a stop (an error, Ctrl-C, a kill) loses at most the chunk under
way, and running the same call again goes on from the first chunk not written. `distill.json` records what the
folder is a distillation of (the files' sizes and times, the teacher, the settings); another call on the same
folder must ask for the same, or it is refused. The two output files are written last, atomically.

With `nbest` > 1 and `references`, the teacher's n-best list is ranked by sentence-level chrF against the
reference and the closest hypothesis is kept (the Firefox Translations pipeline's n-best selection); ties keep
the teacher's order. Without references, the teacher's best is kept.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from tformer.data.corpus import iter_lines
from tformer.errors import ConfigError, DataError
from tformer.files import replace_atomically

MANIFEST = "distill.json"


@dataclass
class DistillReport:
    lines: int
    chunks: int
    resumed_chunks: int  # chunks found written by an earlier call
    seconds: float
    sources: str  # the output files
    targets: str


def pick(hypotheses: Sequence[str], reference: str | None) -> int:
    """The hypothesis to keep: the first whose sentence chrF against `reference` is highest (0 without one)."""
    if reference is None or len(hypotheses) == 1:
        return 0
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    scores = [chrf.sentence_score(h, [reference]).score for h in hypotheses]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def _identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def distill_corpus(teacher, sources: str | Path, out: str | Path, *, references: str | Path | None = None,
                   chunk_size: int = 10_000, progress: bool = False, **options: Any) -> DistillReport:
    """Translate `sources` (UTF-8, plain or gzip, one sentence per line) with `teacher` (a Translator) into
    `out`/train.{src_lang} and `out`/train.{tgt_lang}, resumable chunk by chunk (module docstring). `options`:
    as Translator.translate (beam, nbest, DecodeConfig fields). Empty source lines give empty targets, so the
    files stay line-aligned."""
    sources, out = Path(sources), Path(out)
    refs = Path(references) if references is not None else None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a whole number >= 1, got {chunk_size!r}")
    settings = teacher.decode_settings(**options)  # checked before anything is read
    if settings.nbest > 1 and refs is None:
        raise ConfigError(f"nbest={settings.nbest} keeps the hypothesis closest to the reference: give references "
                          "(the corpus' target side), or nbest=1")
    data = teacher.config.data
    manifest = {"sources": _identity(sources), "references": _identity(refs) if refs else None,
                "teacher": {"path": str(teacher.path), "models": len(teacher.model.models) if teacher.ensemble else 1}, "decode": asdict(settings), "chunk_size": chunk_size}
    parts = out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    recorded = out / MANIFEST
    if recorded.exists():
        before = json.loads(recorded.read_text(encoding="utf-8"))
        if before != json.loads(json.dumps(manifest)):
            changed = sorted(k for k in manifest if json.loads(json.dumps(manifest[k])) != before.get(k))
            raise ConfigError(f"{out} holds a distillation of other inputs or settings ({', '.join(changed)} "
                              "differ); choose another folder, or delete it to start again")
    else:
        with replace_atomically(recorded) as f:
            f.write(json.dumps(manifest, indent=1) + "\n")
    tic, lines, chunks, resumed = time.perf_counter(), 0, 0, 0
    src_lines = iter_lines(sources)
    ref_lines = iter_lines(refs) if refs else None
    bar = None
    if progress:
        from tqdm import tqdm

        from tformer.data.prepare import count_lines

        bar = tqdm(total=count_lines(sources), unit=" lines", desc="distilling", mininterval=1.0)
    while chunk := [line.rstrip("\r\n") for line in itertools.islice(src_lines, chunk_size)]:
        first = lines + 1
        refs_chunk = None
        if ref_lines is not None:
            refs_chunk = [line.rstrip("\r\n") for line in itertools.islice(ref_lines, len(chunk))]
            if len(refs_chunk) < len(chunk):
                raise DataError(f"{refs} ends at line {first + len(refs_chunk) - 1} but {sources} goes on; give one "
                                "reference per source line")
        part = parts / f"{chunks:06d}.tgt"
        if part.exists():
            resumed += 1
        else:
            out_lines = _translate(teacher, chunk, refs_chunk, sources, first, options)
            with replace_atomically(part) as f:
                f.writelines(line + "\n" for line in out_lines)
        lines += len(chunk)
        chunks += 1
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    if ref_lines is not None and next(ref_lines, None) is not None:
        raise DataError(f"{refs} has more lines than {sources} ({lines}); give one reference per source line")
    if not lines:
        raise DataError(f"{sources} is empty: nothing to distil")
    src_out, tgt_out = out / f"train.{data.src_lang}", out / f"train.{data.tgt_lang}"
    with replace_atomically(src_out) as fs, replace_atomically(tgt_out) as ft:
        for line in iter_lines(sources):
            fs.write(line.rstrip("\r\n") + "\n")
        for k in range(chunks):
            ft.write((parts / f"{k:06d}.tgt").read_text(encoding="utf-8"))
    return DistillReport(lines, chunks, resumed, round(time.perf_counter() - tic, 2), str(src_out), str(tgt_out))


def _translate(teacher, chunk: list[str], refs: list[str] | None, name: Path, first: int,
               options: dict[str, Any]) -> list[str]:
    """One chunk's kept translations (one line each: newlines inside become spaces)."""
    try:
        done = teacher.translate(chunk, **options)
    except DataError as e:  # name the corpus line, not the chunk's list index
        raise DataError(f"{name}, from line {first}: {e}") from None
    kept = []
    for i, t in enumerate(done):
        texts = [h.text for h in t.hypotheses]
        kept.append(" ".join(texts[pick(texts, refs[i] if refs else None)].split()))
    return kept


# ---------------------------------------------------------------------------------------------- the student


def write_split(teacher, split: str, folder: str | Path, prefix: str | None = None) -> tuple[Path, Path]:
    """The teacher's own `split` ("train", "valid", "test": of the corpus its config names, a TSV file's seeded
    split included) as line-aligned text files folder/PREFIX.SRC and folder/PREFIX.TGT (PREFIX: the split's
    name), each written atomically. Files already there are kept as they are (a resumed distillation then finds
    the sources it recorded)."""
    data = teacher.config.data
    folder = Path(folder)
    paths = folder / f"{prefix or split}.{data.src_lang}", folder / f"{prefix or split}.{data.tgt_lang}"
    if not all(p.exists() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        for path, lines in zip(paths, teacher.load_split(split).texts[split]):
            with replace_atomically(path) as f:
                f.writelines(line + "\n" for line in lines)
    return paths


def student_overrides(teacher, folder: str | Path) -> list[str]:
    """Dotted overrides that point a student recipe at a distilled `folder` (its train.SRC, train.TGT) with the
    teacher's languages, validation and test sets: the teacher's files (absolute paths, so the student's data.dir
    can change), or, where the teacher's corpus is not a folder of files (a TSV file split by seed), its valid
    and test splits written into `folder` (`write_split`)."""
    data = teacher.config.data
    out = [f"data.dir={Path(folder).resolve()}", "data.format=files", f"data.src_lang={data.src_lang}",
           f"data.tgt_lang={data.tgt_lang}", "data.train_prefix=train"]
    if data.format == "files":
        if not data.dir:  # an imported model knows no corpus: the student's recipe (or --student-set) names them
            return out
        base = Path(data.dir).resolve()
        return out + [f"data.valid_prefix={base / data.valid_prefix}", f"data.test_prefix={base / data.test_prefix}"]
    for split in ("valid", "test"):
        write_split(teacher, split, folder)
    return out + ["data.valid_prefix=valid", "data.test_prefix=test"]


@dataclass
class ModelRow:
    name: str
    bleu: float
    chrf: float
    seconds: float  # translating the split, once
    sentences_per_second: float
    parameters: int
    megabytes: float  # the weights as held for decoding (their state dict saved: int8 layers at one byte a weight)


def parameter_count(model) -> int:
    """The weights `model` holds, each shared tensor once, counted also where int8 layers hold them packed (not as
    parameters; an int8 generator is a copy of a tied embedding, so it counts again)."""
    import torch

    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight, bias = module._packed_params._weight_bias()
            count += weight.numel() + (0 if bias is None else bias.numel())
    return count


def weights_megabytes(model) -> float:
    """The size of `model`'s state dict as torch.save writes it (int8 layers hold their packed int8 weights)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return round(buffer.tell() / 2**20, 2)


def compare(models: dict[str, Any], sources: list[str], references: list[str], language: str, *,
            batch_size: int = 32, **options: Any) -> list[ModelRow]:
    """Each Translator of `models` (name -> Translator) translates `sources` in batches of `batch_size`, timed,
    and is scored by sacreBLEU and chrF against `references` (target `language`; tformer.metrics). `options`: decoding settings
    for every model (beam, ...); each model's own decode.* (its int8 weights, its shortlist) stay its own."""
    from tformer.metrics import translation_scores

    rows = []
    for name, translator in models.items():
        tic = time.perf_counter()
        outputs = [t.hypotheses[0].text for t in translator.translate(sources, batch_size=batch_size, **options)]
        seconds = time.perf_counter() - tic
        scores = translation_scores(outputs, references, language)
        models_ = translator.model.models if translator.ensemble else [translator.model]
        rows.append(ModelRow(name, round(scores.bleu, 2), round(scores.chrf, 2), round(seconds, 2),
                             round(len(sources) / seconds, 1), sum(parameter_count(m) for m in models_),
                             round(sum(weights_megabytes(m) for m in models_), 2)))
    return rows


def format_rows(rows: list[ModelRow]) -> str:
    """A table of `compare`'s rows, with each model's speed as a multiple of the first's."""
    lines = ["| model | BLEU | chrF | seconds | sentences/s | speed | parameters | MB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.bleu:.2f} | {r.chrf:.2f} | {r.seconds:.2f} | {r.sentences_per_second:.1f} | "
                     f"{rows[0].seconds / r.seconds:.2f}x | {r.parameters:,} | {r.megabytes:.2f} |")
    return "\n".join(lines)
