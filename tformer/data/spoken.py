"""A spoken corpus anyone can rebuild offline: sentences read aloud by espeak-ng, in the 'speech' format.

    build_spoken_corpus(sentences, out, SpokenSettings(...)) -> SpokenCorpus (what was written, with counts)

Sentences become transcripts by `transcript` (lower case, letters, apostrophes and spaces; sentences with
digits are left out, since their spoken form is not their written one). Distinct transcripts are shuffled
(seeded) and split by sentence, so no test or validation sentence is ever heard in training. Each training
sentence is spoken `renditions` times, each time by its own voice (an espeak-ng language and variant), speed
and pitch, drawn from the settings, and with white noise at one of `snrs` dB or none; valid and test are
spoken once each, clean, and `test_snr{N}` repeats the test utterances with noise at `test_snr` dB.

    OUT/{split}.tsv              'id<TAB>transcript' per utterance (what tformer's speech task reads)
    OUT/{split}/{n:06d}.flac     16 kHz mono 16-bit audio; the id is '{split}/{n:06d}'
    OUT/utterances.tsv           id, voice, speed, pitch, snr (dB, or 'clean') and the text spoken
    OUT/spoken.json              the espeak-ng version, the settings, the source file and the split sizes

espeak-ng writes 22,050 Hz (its rate is read from the header); the audio is resampled to 16 kHz with soxr before
noise is added. Every file is written under a temporary name and renamed, each split's list last: an interrupted
build keeps the finished audio, and the same command run again completes it
(each utterance's noise is seeded by its own id).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
from tqdm import tqdm

from tformer.data.audio import SAMPLE_RATE
from tformer.errors import DataError
from tformer.files import replace_atomically

ESPEAK = "espeak-ng"
INSTALL_HINT = ("install it: Debian/Ubuntu `apt-get install espeak-ng` (or `bash scripts/install-espeak.sh`), "
                "macOS `brew install espeak-ng`")


@dataclass(frozen=True)
class SpokenSettings:
    train: int = 10000  # sentences in training (each spoken `renditions` times)
    valid: int = 300  # sentences in validation (spoken once, clean)
    test: int = 500  # sentences in test (spoken once clean, and once more at test_snr)
    renditions: int = 2  # voices per training sentence
    voices: tuple[str, ...] = ("en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp")  # espeak-ng languages
    variants: tuple[str, ...] = ("m1", "m3", "m7", "f1", "f2", "f4")  # espeak-ng voice variants (+name)
    speeds: tuple[int, int] = (140, 190)  # words per minute, drawn uniformly from this range
    pitches: tuple[int, int] = (30, 70)  # espeak-ng pitch 0-99, drawn uniformly
    snrs: tuple[float, ...] = (20.0, 10.0)  # training: clean or white noise at one of these (dB), all alike
    test_snr: float = 10.0  # the noisy copy of the test split
    min_chars: int = 8  # transcripts shorter or longer are left out
    max_chars: int = 60
    seed: int = 1
    workers: int = field(default=0, compare=False)  # processes (0: one per core); does not change the corpus

    def __post_init__(self) -> None:
        for name in ("train", "valid", "test", "renditions", "min_chars"):
            if getattr(self, name) < 1:
                raise DataError(f"spoken corpus: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_chars < self.min_chars:
            raise DataError(f"spoken corpus: max_chars={self.max_chars} is below min_chars={self.min_chars}")
        if not self.voices or not self.variants:
            raise DataError("spoken corpus: give at least one voice and one variant")
        for name in ("speeds", "pitches"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise DataError(f"spoken corpus: {name} range {lo}-{hi} is empty")


class Utterance(NamedTuple):
    split: str
    id: str  # '{split}/{n:06d}'
    text: str  # what espeak-ng reads
    transcript: str  # what the model writes
    voice: str  # 'en-us+f2'
    speed: int
    pitch: int
    snr: float | None  # dB of white noise, None: clean


@dataclass
class SpokenCorpus:
    folder: Path
    splits: dict[str, int]  # utterances per split
    seconds: dict[str, float]  # audio per split
    espeak: str  # espeak-ng's version line


_NOT_SPOKEN = re.compile(r"[^a-z' ]")


def transcript(sentence: str) -> str | None:
    """What a listener can write down: lower case, letters, apostrophes and single spaces; None for a sentence
    with digits or with letters outside a-z (accents, other scripts)."""
    s = sentence.split("\t", 1)[0].strip().lower().replace("\u2019", "'").replace("\u2018", "'")
    if any(c.isdigit() for c in s):
        return None
    s = re.sub(r"[-\u2013\u2014/]", " ", s)
    s = re.sub(r"[.,!?;:\"()\u201c\u201d\u00ab\u00bb]", "", s)
    s = " ".join(w.strip("'") for w in s.split())
    s = " ".join(s.split())
    if not s or _NOT_SPOKEN.search(s):
        return None
    return s


def espeak_version() -> str:
    """espeak-ng's version line; a DataError saying how to install it where it is not installed."""
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise DataError(f"{ESPEAK} is not installed, and the spoken corpus is synthesised with it; {INSTALL_HINT}")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def plan(sentences: Iterable[str], settings: SpokenSettings) -> list[Utterance]:
    """Every utterance of the corpus, a pure function of the sentences (in order) and the settings."""
    texts: dict[str, str] = {}
    for s in sentences:
        t = transcript(s)
        if t is not None and settings.min_chars <= len(t) <= settings.max_chars and t not in texts:
            texts[t] = s.split("\t", 1)[0].strip()
    need = settings.train + settings.valid + settings.test
    if len(texts) < need:
        raise DataError(f"spoken corpus: {len(texts)} distinct usable sentences ({settings.min_chars}-"
                        f"{settings.max_chars} characters, no digits), {need} needed (train {settings.train}, "
                        f"valid {settings.valid}, test {settings.test}); lower the sizes or give more text")
    rng = np.random.default_rng(settings.seed)
    keys = list(texts)
    order = rng.permutation(len(keys))[:need]
    chosen = [keys[i] for i in order]
    parts = {"test": chosen[: settings.test], "valid": chosen[settings.test : settings.test + settings.valid],
             "train": chosen[settings.test + settings.valid :]}
    out: list[Utterance] = []

    def voice() -> tuple[str, int, int]:
        language = settings.voices[rng.integers(len(settings.voices))]
        v = f"{language}+{settings.variants[rng.integers(len(settings.variants))]}"
        return v, int(rng.integers(settings.speeds[0], settings.speeds[1] + 1)), int(
            rng.integers(settings.pitches[0], settings.pitches[1] + 1))

    n = 0
    for t in parts["train"]:
        for _ in range(settings.renditions):
            v, speed, pitch = voice()
            k = int(rng.integers(len(settings.snrs) + 1))
            snr = None if k == len(settings.snrs) else float(settings.snrs[k])
            out.append(Utterance("train", f"train/{n:06d}", texts[t], t, v, speed, pitch, snr))
            n += 1
    noisy = f"test_snr{settings.test_snr:g}"
    for split in ("valid", "test"):
        for n, t in enumerate(parts[split]):
            v, speed, pitch = voice()
            out.append(Utterance(split, f"{split}/{n:06d}", texts[t], t, v, speed, pitch, None))
            if split == "test":
                out.append(Utterance(noisy, f"{noisy}/{n:06d}", texts[t], t, v, speed, pitch, settings.test_snr))
    return out


def synthesize(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    """espeak-ng reading `text`, as 16 kHz float32 samples."""
    import soundfile
    import soxr

    exe = shutil.which(ESPEAK)
    if exe is None:
        raise DataError(f"{ESPEAK} is not installed; {INSTALL_HINT}")
    run = subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout"], input=text.encode(),
                         capture_output=True, check=False)
    if run.returncode != 0 or not run.stdout:
        raise DataError(f"{ESPEAK} -v {voice} failed on {text!r}: {run.stderr.decode(errors='replace').strip()}")
    wave, rate = soundfile.read(io.BytesIO(run.stdout), dtype="float32")
    return soxr.resample(wave, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)


def add_noise(wave: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    """White Gaussian noise at `snr_db` below the utterance's mean power."""
    power = float(np.mean(wave.astype(np.float64) ** 2))
    std = np.sqrt(power / 10 ** (snr_db / 10))
    noise = np.random.default_rng(seed).standard_normal(wave.size) * std
    return (wave + noise).astype(np.float32)


def _render(folder: str, u: Utterance) -> float:
    """Write one utterance's audio (unless there already); its length in seconds."""
    import soundfile

    path = Path(folder) / f"{u.id}.flac"
    if path.exists():
        return soundfile.info(path).duration
    wave = synthesize(u.text, u.voice, u.speed, u.pitch)
    if u.snr is not None:
        wave = add_noise(wave, u.snr, zlib.crc32(u.id.encode()))
    wave = np.clip(wave, -1.0, 32767 / 32768)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    soundfile.write(tmp, wave, SAMPLE_RATE, subtype="PCM_16", format="FLAC")
    os.replace(tmp, path)
    return wave.size / SAMPLE_RATE


def build_spoken_corpus(sentences: Iterable[str], out: str | Path, settings: SpokenSettings = SpokenSettings(),
                        source: str = "", progress: bool = True) -> SpokenCorpus:
    """Synthesise the corpus into `out` (see the module docstring); a rerun completes an interrupted build."""
    version = espeak_version()
    folder = Path(out)
    utts = plan(sentences, settings)
    splits = sorted({u.split for u in utts}, key=[u.split for u in utts].index)
    for split in splits:
        (folder / split).mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {s: 0.0 for s in splits}
    workers = settings.workers or os.cpu_count() or 1
    with cf.ProcessPoolExecutor(workers) as pool, tqdm(total=len(utts), unit="utt", desc="espeak-ng",
                                                        disable=not progress) as bar:
        for u, secs in zip(utts, pool.map(_render, [str(folder)] * len(utts), utts, chunksize=64)):
            seconds[u.split] += secs
            bar.update()
    with replace_atomically(folder / "utterances.tsv") as f:
        f.write("id\tvoice\tspeed\tpitch\tsnr\ttext\n")
        for u in utts:
            f.write(f"{u.id}\t{u.voice}\t{u.speed}\t{u.pitch}\t{'clean' if u.snr is None else f'{u.snr:g}'}\t"
                    f"{u.text}\n")
    for split in splits:
        with replace_atomically(folder / f"{split}.tsv") as f:
            f.writelines(f"{u.id}\t{u.transcript}\n" for u in utts if u.split == split)
    counts = {s: sum(u.split == s for u in utts) for s in splits}
    manifest = {"espeak_ng": version, "settings": asdict(settings), "source": source,
                "source_sha256": hashlib.sha256("\n".join(u.text for u in utts).encode()).hexdigest(),
                "sample_rate": SAMPLE_RATE, "utterances": counts,
                "hours": {s: round(v / 3600, 3) for s, v in seconds.items()}}
    with replace_atomically(folder / "spoken.json") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")
    return SpokenCorpus(folder, counts, seconds, version)
