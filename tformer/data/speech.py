"""Continuous-feature (speech-style) data: utterances of float frames with a transcript.

On disk (task 'speech'): per split a UTF-8 file {data.dir}/{prefix}.tsv of lines `id<TAB>transcript`, and
per utterance {data.dir}/{id}.wav, .flac or .ogg, 16 kHz mono audio whose model.feature_dim log-mel
filterbanks are computed (tformer.data.audio), or {data.dir}/{id}.npy, a 2-D float array (frames,
model.feature_dim) written by `numpy.save` (features computed elsewhere). Every problem is reported with the
file, line and utterance id (up to MAX_REPORTED of them at once): a line without one tab, an empty
transcript, a duplicate id, an id that leaves the folder, a missing or unreadable file, audio that is not
mono or not 16 kHz or holds no samples, pickled objects (never loaded), the wrong number of dimensions or
values per frame, no frames, more than data.max_frames frames, NaN or infinite values. Headers are checked
for every utterance before any features are computed.

In memory (task 'synthetic_speech'), deterministic under data.seed: letters grouped into words; each letter
becomes a block of frames around its own prototype vector (unit variance per value), a space a block of
noise alone, each block of min_frames .. max_symbol_frames frames shaped by a raised-sine envelope (so two
equal letters in a row still show a boundary), Gaussian noise of std data.noise on every frame and, with
data.gap_frames, up to that many noise frames between letters. The model transcribes the frames back.

Targets are characters (CharTokenizer; a space is the token '▁') or SentencePiece pieces.
Notation: S frames, F values per frame.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import torch
from torch import Tensor

from tformer.config import DataConfig
from tformer.data.audio import AUDIO_SUFFIXES, SAMPLE_RATE, FbankOptions, audio_features
from tformer.data.corpus import normalize, read_lines
from tformer.data.synthetic import SPLITS, symbol_names
from tformer.data.vocab import Vocab
from tformer.errors import DataError

SPACE = "\u2581"  # '▁', SentencePiece's word boundary: a space as a vocabulary token
MAX_REPORTED = 10
WORD_LENGTHS = (1, 6)  # synthetic words have 1 .. 6 letters, uniformly


class SpeechDataError(DataError):
    """Problems with a speech corpus; the message lists each with its file, line and utterance."""


class Utterances(NamedTuple):
    ids: list[str]
    transcripts: list[str]  # normalised text
    frames: list[Tensor]  # (S, F) float32 each


class CharTokenizer:
    """Characters as tokens; a space is '▁'. Built from the training transcripts."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab

    @classmethod
    def build(cls, texts: Iterable[str]) -> "CharTokenizer":
        return cls(Vocab.build(cls.units(t) for t in texts))

    @staticmethod
    def units(text: str) -> list[str]:
        return [SPACE if c == " " else c for c in text]

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(self.units(text))

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.vocab.decode(ids)).replace(SPACE, " ")

    def fingerprint(self) -> str:
        return hashlib.sha256(("char\n" + "\n".join(self.vocab.itos)).encode("utf-8")).hexdigest()


class FrameInput:
    """The source side of a frame encoder: no vocabulary beyond the specials, nothing to tokenise."""

    def __init__(self, vocab: Vocab | None = None) -> None:
        self.vocab = vocab or Vocab([])

    def encode(self, text: str) -> list[int]:
        raise DataError("a frame encoder reads .npy features, not text")

    def decode(self, ids: Iterable[int]) -> str:
        raise DataError("a frame encoder has no source text")

    def fingerprint(self) -> str:
        return "frames"


# --------------------------------------------------------------------------- files


def check_frames(array: np.ndarray, feature_dim: int, max_frames: int = 0) -> str | None:
    """What is wrong with one utterance's array, or None."""
    if array.dtype.kind not in "fiu":
        return f"holds {array.dtype} values, not numbers"
    if array.ndim != 2:
        return f"has shape {array.shape}; expected 2 dimensions (frames, {feature_dim})"
    if array.shape[1] != feature_dim:
        return (f"has {array.shape[1]} values per frame, the model reads {feature_dim} "
                "(model.feature_dim)")
    if array.shape[0] == 0:
        return "has no frames"
    if max_frames and array.shape[0] > max_frames:
        return f"has {array.shape[0]} frames, more than data.max_frames={max_frames}"
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        return f"frame {int(np.argmax(bad))} holds NaN or infinite values ({int(bad.sum())} such frames)"
    return None


def load_frames(path: Path, feature_dim: int, max_frames: int = 0) -> Tensor:
    """One .npy file as (S, F) float32; never unpickles. Errors name the file."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise SpeechDataError(f"{path}: features file is missing") from None
    except (ValueError, OSError, EOFError) as e:  # pickled objects, truncated or foreign files
        raise SpeechDataError(f"{path}: not a .npy array of numbers ({e})") from None
    problem = check_frames(array, feature_dim, max_frames)
    if problem:
        raise SpeechDataError(f"{path}: {problem}")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


FEATURE_SUFFIXES = (".npy",) + AUDIO_SUFFIXES  # what an utterance id may name beside the list, in this order


class Entry(NamedTuple):
    line: int  # in the list, from 1
    id: str
    transcript: str  # normalised
    path: Path  # its features (.npy) or audio file


def utterance_file(folder: Path, utt: str) -> Path | None:
    """{folder}/{utt}.npy, .wav, .flac or .ogg, the first that exists (or {folder}/{utt} when the id names its
    file with one of those suffixes); None when there is none."""
    if Path(utt).suffix in FEATURE_SUFFIXES and (folder / utt).is_file():
        return folder / utt
    for suffix in FEATURE_SUFFIXES:
        path = folder / f"{utt}{suffix}"
        if path.is_file():
            return path
    return None


def split_list(cfg: DataConfig, split: str) -> Path:
    """{data.dir}/{prefix}.tsv of a split."""
    prefix = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}[split]
    return Path(cfg.dir) / f"{prefix}.tsv"


def raise_problems(tsv: Path, problems: list[str]) -> None:
    if problems:
        shown = "\n  ".join(problems[:MAX_REPORTED])
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        raise SpeechDataError(f"{len(problems)} problem(s) in {tsv}; fix or remove these utterances:\n  "
                              f"{shown}{more}")


def read_list(tsv: Path) -> list[Entry]:
    """The utterances a list names, each with its file; every line problem and missing file is reported at once
    (see the module docstring). The files themselves are not read."""
    folder = tsv.parent
    lines = read_lines(tsv)  # missing file, gzip, invalid UTF-8: errors with the line
    out: list[Entry] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        where = f"{tsv}, line {n}"
        if not line.strip():
            problems.append(f"{where}: empty line")
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            problems.append(f"{where}: expected 'id<TAB>transcript', found {len(fields) - 1} tabs")
            continue
        utt, text = fields[0].strip(), normalize(fields[1])
        if not utt:
            problems.append(f"{where}: empty utterance id")
            continue
        if Path(utt).is_absolute() or ".." in Path(utt).parts:
            problems.append(f"{where}: utterance id '{utt}' points outside {folder}")
            continue
        if utt in seen:
            problems.append(f"{where}: utterance '{utt}' repeats line {seen[utt]}")
            continue
        seen[utt] = n
        if not text:
            problems.append(f"{where}: utterance '{utt}' has an empty transcript")
            continue
        path = utterance_file(folder, utt)
        if path is None:
            problems.append(f"{where}: utterance '{utt}': {folder / utt}.npy (or .wav, .flac, .ogg) is missing")
            continue
        out.append(Entry(n, utt, text, path))
    raise_problems(tsv, problems)
    if not out:
        raise SpeechDataError(f"{tsv} holds no utterances")
    return out


def check_file(path: Path, feature_dim: int) -> str | None:
    """What a file's header says is wrong (channels, rate, no samples; an .npy's shape and type), or None; the
    contents are checked when they are read (utterance_features)."""
    if path.suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            return f"{path}: not a .npy array of numbers ({e})"
        if array.dtype.kind not in "fiu" or array.ndim != 2 or array.shape[1] != feature_dim or not array.shape[0]:
            header = np.lib.stride_tricks.as_strided(np.zeros(1, array.dtype), array.shape, (0,) * array.ndim)
            return f"{path}: {check_frames(header, feature_dim)}"  # the header's shape and type, nothing read
        return None
    import soundfile

    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError, OSError) as e:
        return f"{path}: not a readable audio file ({e})"
    if info.channels != 1:
        return f"{path}: {info.channels} channels; tformer reads mono audio: mix it down first (e.g. sox in -c 1 out)"
    if info.samplerate != SAMPLE_RATE:
        return (f"{path}: sampled at {info.samplerate} Hz; tformer reads {SAMPLE_RATE} Hz: resample it first "
                f"(e.g. sox in -r {SAMPLE_RATE} out)")
    if info.frames == 0:
        return f"{path}: holds no samples"
    return None


def check_files(tsv: Path, entries: list[Entry], feature_dim: int) -> None:
    """Every file's header checked before anything is computed; all problems at once, with their lines."""
    problems = []
    for e in entries:
        problem = check_file(e.path, feature_dim)
        if problem:
            problems.append(f"{tsv}, line {e.line}: utterance '{e.id}': {problem}")
    raise_problems(tsv, problems)


def utterance_features(path: Path, feature_dim: int, max_frames: int = 0) -> np.ndarray:
    """One utterance's frames (S, F) float32: an .npy file as it is, audio as log-mel filterbanks of
    feature_dim bins (tformer.data.audio). Errors name the file."""
    if path.suffix != ".npy":
        frames = audio_features(path, FbankOptions(num_mel_bins=feature_dim))
        problem = check_frames(frames, feature_dim, max_frames)
        if problem:
            raise SpeechDataError(f"{path}: {problem}")
        return frames
    return load_frames(path, feature_dim, max_frames).numpy()


def source_frames(source: object, feature_dim: int, where: str) -> Tensor:
    """A frame encoder's input as frames (S, F) float32, checked: an audio file (.wav, .flac, .ogg) or .npy
    file, a 16 kHz waveform (samples,) (its filterbanks), or frames (S, feature_dim), as an array or a tensor.
    A DataError names `where` (the list entry or file line)."""
    from tformer.data.audio import check_waveform, fbank

    if isinstance(source, (str, Path)) and Path(source).suffix.lower() in FEATURE_SUFFIXES:
        return torch.from_numpy(utterance_features(Path(source), feature_dim))
    if isinstance(source, str) or not hasattr(source, "shape"):
        raise DataError(f"{where}: this model reads speech: an audio file (.wav, .flac, .ogg), a .npy file, a 16 kHz "
                        f"waveform (samples,) or feature frames (frames, {feature_dim}); got {type(source).__name__}")
    array = source.detach().cpu().numpy() if isinstance(source, Tensor) else np.asarray(source)
    if array.ndim == 1:  # a waveform: its filterbanks
        problem = check_waveform(array)
        if problem:
            raise DataError(f"{where}: the waveform {problem}")
        return torch.from_numpy(fbank(array, FbankOptions(num_mel_bins=feature_dim)))
    problem = check_frames(array, feature_dim)
    if problem:
        raise DataError(f"{where}: {problem}")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def read_speech_split(cfg: DataConfig, split: str, feature_dim: int) -> Utterances:
    """The utterances of one split of a 'speech' corpus, all checked (see the module docstring), with their
    features computed now (prepared corpora store them: tformer.data.features)."""
    tsv = split_list(cfg, split)
    entries = read_list(tsv)
    check_files(tsv, entries, feature_dim)
    out = Utterances([], [], [])
    problems: list[str] = []
    for e in entries:
        try:
            frames = utterance_features(e.path, feature_dim, cfg.max_frames)
        except DataError as err:
            problems.append(f"{tsv}, line {e.line}: utterance '{e.id}': {err}")
            continue
        out.ids.append(e.id)
        out.transcripts.append(e.transcript)
        out.frames.append(torch.from_numpy(frames))
    raise_problems(tsv, problems)
    return out


def write_speech_split(folder: str | Path, prefix: str, utterances: Utterances) -> None:
    """The on-disk format, for tests and for users converting their features."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{prefix}.tsv", "w", encoding="utf-8") as f:
        for utt, text, frames in zip(*utterances):
            np.save(folder / f"{utt}.npy", frames.numpy())
            f.write(f"{utt}\t{text}\n")


# --------------------------------------------------------------------------- synthetic


def prototypes(cfg: DataConfig, feature_dim: int) -> Tensor:
    """(symbols, F): one unit-variance vector per letter; the same for every split of a seed."""
    g = torch.Generator().manual_seed(cfg.seed * 7919 + 17)
    return torch.randn(cfg.symbols, feature_dim, generator=g)


def synthetic_speech_split(cfg: DataConfig, split: str, feature_dim: int) -> Utterances:
    """One split of the synthetic speech-like task; utterance lengths (in letters) as for copy and sort."""
    size = {"train": cfg.train_size, "valid": cfg.valid_size, "test": cfg.test_size}[split]
    g = torch.Generator().manual_seed(cfg.seed * 1000 + 100 + SPLITS.index(split))
    protos = prototypes(cfg, feature_dim)
    letters = symbol_names(cfg.symbols)
    n_letters = (torch.randn(size, generator=g, dtype=torch.float64) * cfg.length_std + cfg.length_mean).floor()
    n_letters = n_letters.clamp(cfg.min_len, cfg.max_len).long().tolist()
    out = Utterances([], [], [])
    for u, n in enumerate(n_letters):
        ids = torch.randint(cfg.symbols, (n,), generator=g).tolist()
        words, i = [], 0
        while i < n:
            w = int(torch.randint(WORD_LENGTHS[0], WORD_LENGTHS[1] + 1, (1,), generator=g))
            words.append(ids[i : i + w])
            i += w
        blocks: list[Tensor] = []
        for k, word in enumerate(words):
            if k:
                blocks.append(_block(None, cfg, feature_dim, g))  # the space: noise alone
            for j, letter in enumerate(word):
                if j and cfg.gap_frames:
                    gap = int(torch.randint(0, cfg.gap_frames + 1, (1,), generator=g))
                    blocks.append(cfg.noise * torch.randn(gap, feature_dim, generator=g))
                blocks.append(_block(protos[letter], cfg, feature_dim, g))
        out.ids.append(f"{split}-{u:06d}")
        out.transcripts.append(" ".join("".join(letters[c] for c in word) for word in words))
        out.frames.append(torch.cat(blocks))
    return out


def _block(proto: Tensor | None, cfg: DataConfig, feature_dim: int, g: torch.Generator) -> Tensor:
    d = int(torch.randint(cfg.min_frames, cfg.max_symbol_frames + 1, (1,), generator=g))
    envelope = torch.sin(math.pi * (torch.arange(d) + 0.5) / d)[:, None]  # (d, 1), low at the edges
    signal = torch.zeros(d, feature_dim) if proto is None else envelope * proto[None]
    return signal + cfg.noise * torch.randn(d, feature_dim, generator=g)  # (d, F)


def load_utterances(cfg: DataConfig, split: str, feature_dim: int) -> Utterances:
    if cfg.task == "synthetic_speech":
        return synthetic_speech_split(cfg, split, feature_dim)
    return read_speech_split(cfg, split, feature_dim)


# --------------------------------------------------------------------------- scores


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance (substitutions, insertions, deletions, each 1)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def error_rates(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Corpus character and word error rate in percent: edits summed over utterances / reference length
    summed (characters include spaces; words split on whitespace)."""
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    char_edits = sum(edit_distance(list(h), list(r)) for h, r in zip(hypotheses, references))
    word_edits = sum(edit_distance(h.split(), r.split()) for h, r in zip(hypotheses, references))
    chars = sum(len(r) for r in references)
    words = sum(len(r.split()) for r in references)
    return {"cer": 100.0 * char_edits / max(chars, 1), "wer": 100.0 * word_edits / max(words, 1)}
