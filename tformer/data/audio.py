"""Audio in: 16 kHz mono waveforms read from wav/flac files, and Kaldi-compatible log-mel filterbanks.

    read_audio(path)      -> (N,) float32 samples in [-1, 1]; refuses what it cannot read, with the reason
    fbank(samples, opts)  -> (S, F) float32: F log-mel energies every opts.shift_ms (kaldi-native-fbank)

Files are read with libsndfile (the `soundfile` package): PCM or float wav, flac, ogg. A recording must be
mono at 16 kHz: other rates and several channels are refused with the command that converts them (sox), so
what the model hears never depends on a resampler chosen here. Features are Kaldi's `compute-fbank-feats`
(povey window, pre-emphasis 0.97, DC removed, power spectrum, log of mel energies floored at FLT_EPSILON), on
samples scaled to 16-bit range as Kaldi reads them, without dither: the same file always gives the same frames.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tformer.errors import DataError

SAMPLE_RATE = 16000
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
PCM_SCALE = 32768.0  # Kaldi reads 16-bit samples as integers: features are computed at that scale


class AudioError(DataError):
    """An audio file that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class FbankOptions:
    """Kaldi's fbank options that tformer exposes; the rest are Kaldi's defaults (snip_edges, povey window)."""

    num_mel_bins: int = 80  # F, the values per frame (model.feature_dim)
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0  # one frame every 10 ms: 100 frames per second
    low_freq: float = 20.0  # Hz, the lowest mel bin's left edge
    high_freq: float = 0.0  # Hz; <= 0: that far below the Nyquist frequency (Kaldi's convention)

    def to_dict(self) -> dict:
        return asdict(self)


def read_audio(path: str | Path) -> np.ndarray:
    """The samples of a mono 16 kHz file as (N,) float32 in [-1, 1]. Missing, unreadable, empty, multichannel
    and other-rate files are AudioErrors naming the file."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise AudioError(f"{path}: audio file is missing")
    try:
        with soundfile.SoundFile(path) as f:
            rate, channels = f.samplerate, f.channels
            if channels != 1:
                raise AudioError(f"{path}: {channels} channels; tformer reads mono audio: mix it down first, e.g. "
                                 f"`sox {path.name} -c 1 mono{path.suffix}`")
            if rate != SAMPLE_RATE:
                raise AudioError(f"{path}: sampled at {rate} Hz; tformer reads {SAMPLE_RATE} Hz: resample it first, "
                                 f"e.g. `sox {path.name} -r {SAMPLE_RATE} out{path.suffix}`")
            samples = f.read(dtype="float32", always_2d=False)
    except (soundfile.LibsndfileError, RuntimeError, OSError, EOFError) as e:
        raise AudioError(f"{path}: not a readable audio file ({e})") from None
    if samples.size == 0:
        raise AudioError(f"{path}: holds no samples")
    if not np.isfinite(samples).all():
        raise AudioError(f"{path}: holds NaN or infinite samples")
    return np.ascontiguousarray(samples, dtype=np.float32)


def check_waveform(samples: np.ndarray, opts: FbankOptions = FbankOptions()) -> str | None:
    """What is wrong with an in-memory waveform (N,), or None."""
    if samples.ndim != 1:
        return f"has shape {samples.shape}; a waveform is one dimension of mono samples at {SAMPLE_RATE} Hz"
    if samples.dtype.kind != "f":
        return f"holds {samples.dtype} samples; pass floats in [-1, 1]"
    if samples.size < frame_samples(opts)[0]:
        return (f"has {samples.size} samples, fewer than one {opts.frame_length_ms:g} ms frame "
                f"({frame_samples(opts)[0]} samples at {SAMPLE_RATE} Hz)")
    if not np.isfinite(samples).all():
        return "holds NaN or infinite samples"
    return None


def frame_samples(opts: FbankOptions) -> tuple[int, int]:
    """(window, shift) in samples."""
    return int(SAMPLE_RATE * opts.frame_length_ms / 1000), int(SAMPLE_RATE * opts.frame_shift_ms / 1000)


def num_frames(n_samples: int, opts: FbankOptions = FbankOptions()) -> int:
    """Frames of a waveform of `n_samples` (Kaldi's snip_edges: whole windows only)."""
    window, shift = frame_samples(opts)
    return 0 if n_samples < window else 1 + (n_samples - window) // shift


def _knf_options(opts: FbankOptions):
    import kaldi_native_fbank as knf

    o = knf.FbankOptions()
    o.frame_opts.samp_freq = SAMPLE_RATE
    o.frame_opts.dither = 0.0
    o.frame_opts.frame_length_ms = opts.frame_length_ms
    o.frame_opts.frame_shift_ms = opts.frame_shift_ms
    o.frame_opts.snip_edges = True
    o.mel_opts.num_bins = opts.num_mel_bins
    o.mel_opts.low_freq = opts.low_freq
    o.mel_opts.high_freq = opts.high_freq
    return o


def fbank(samples: np.ndarray, opts: FbankOptions = FbankOptions()) -> np.ndarray:
    """Log-mel filterbanks (S, num_mel_bins) float32 of a 16 kHz waveform (N,) in [-1, 1]."""
    import kaldi_native_fbank as knf

    problem = check_waveform(samples, opts)
    if problem:
        raise AudioError(f"the waveform {problem}")
    computer = knf.OnlineFbank(_knf_options(opts))
    computer.accept_waveform(SAMPLE_RATE, np.ascontiguousarray(samples, dtype=np.float32) * PCM_SCALE)
    computer.input_finished()
    n = computer.num_frames_ready
    out = np.empty((n, opts.num_mel_bins), dtype=np.float32)
    for i in range(n):
        out[i] = computer.get_frame(i)
    return out


def audio_features(path: str | Path, opts: FbankOptions = FbankOptions()) -> np.ndarray:
    """read_audio then fbank: (S, F) float32; a file too short for one frame is an AudioError naming it."""
    samples = read_audio(path)
    try:
        return fbank(samples, opts)
    except AudioError as e:
        raise AudioError(f"{path}: {str(e).removeprefix('the waveform ')}") from None
