"""Audio in: filterbanks against a numpy re-derivation of Kaldi's compute-fbank-feats, and the file checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

sf = pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")

from tformer.data.audio import (SAMPLE_RATE, AudioError, FbankOptions, audio_features, fbank,  # noqa: E402
                                num_frames, read_audio)


def kaldi_fbank_reference(samples: np.ndarray, bins: int = 80, low: float = 20.0, high: float = 0.0) -> np.ndarray:
    """Kaldi's fbank written out from its definition in float64 (feature-window.cc, mel-computations.cc):
    25 ms windows every 10 ms with snip_edges, DC removed, pre-emphasis 0.97, povey window, zero-padded to 512,
    power spectrum, triangular bins on the mel scale 1127 ln(1 + f/700) over the FFT bins below Nyquist, log
    floored at FLT_EPSILON."""
    x = samples.astype(np.float64) * 32768.0
    win, shift, nfft = 400, 160, 512
    n = 1 + (len(x) - win) // shift
    frames = np.stack([x[i * shift : i * shift + win] for i in range(n)])
    frames = frames - frames.mean(axis=1, keepdims=True)
    emph = frames.copy()
    emph[:, 1:] -= 0.97 * frames[:, :-1]
    emph[:, 0] -= 0.97 * frames[:, 0]
    window = (0.5 - 0.5 * np.cos(2 * math.pi * np.arange(win) / (win - 1))) ** 0.85
    power = np.abs(np.fft.rfft(emph * window, nfft)) ** 2  # (n, 257)
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    nyquist = SAMPLE_RATE / 2
    high = nyquist + high if high <= 0 else high
    lo, hi = mel(low), mel(high)
    delta = (hi - lo) / (bins + 1)
    fft_mel = mel(np.arange(nfft // 2) * SAMPLE_RATE / nfft)  # the Nyquist bin is left out
    weights = np.zeros((bins, nfft // 2))
    for b in range(bins):
        left, centre, right = lo + b * delta, lo + (b + 1) * delta, lo + (b + 2) * delta
        up = (fft_mel - left) / (centre - left)
        down = (right - fft_mel) / (right - centre)
        inside = (fft_mel > left) & (fft_mel < right)
        weights[b] = np.where(inside, np.where(fft_mel <= centre, up, down), 0.0)
    energies = power[:, : nfft // 2] @ weights.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps))


def chirp(seconds: float = 1.3, f0: float = 100.0, f1: float = 7000.0, noise: float = 0.2) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    phase = 2 * math.pi * (f0 * t + (f1 - f0) * t**2 / (2 * seconds))
    noise = noise * np.random.default_rng(0).standard_normal(t.size)  # 8 dB below: bins far from the chirp stay within
    # float32's reach (kaldi-native-fbank computes in float32; the reference in float64)
    return (0.5 * np.sin(phase) + noise).astype(np.float32)


@pytest.mark.parametrize("bins,low,high", [(80, 20.0, 0.0), (40, 64.0, -400.0), (23, 20.0, 7600.0)])
def test_fbank_equals_kaldi_definition_on_a_chirp(bins, low, high):
    x = chirp()
    ours = fbank(x, FbankOptions(num_mel_bins=bins, low_freq=low, high_freq=high))
    ref = kaldi_fbank_reference(x, bins, low, high)
    assert ours.shape == ref.shape == (num_frames(x.size), bins)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-5)
    assert np.abs(ours - ref).mean() < 1e-5


def test_fbank_follows_the_chirp_upwards():
    """A sanity check independent of Kaldi: the loudest mel bin rises with the chirp's frequency."""
    loudest = fbank(chirp(noise=0.01)).argmax(axis=1)
    assert loudest[-10:].mean() > loudest[:10].mean() + 40


def test_reading_a_file_gives_the_samples_written(tmp_path):
    x = chirp(0.5, noise=0.01)
    for suffix in (".wav", ".flac"):
        path = tmp_path / f"a{suffix}"
        sf.write(path, x, SAMPLE_RATE, subtype="PCM_16")
        back = read_audio(path)
        assert back.dtype == np.float32 and back.shape == x.shape
        np.testing.assert_allclose(back, x, atol=1 / 32768 + 1e-7)  # 16-bit quantisation
        np.testing.assert_allclose(audio_features(path), fbank(back), atol=0)


@pytest.mark.parametrize("make,message", [
    (lambda p: sf.write(p, np.zeros((1600, 2), np.float32), SAMPLE_RATE), "2 channels"),
    (lambda p: sf.write(p, np.zeros(800, np.float32), 8000), "sampled at 8000 Hz"),
    (lambda p: sf.write(p, np.zeros(0, np.float32), SAMPLE_RATE), "no samples"),
    (lambda p: p.write_bytes(b"RIFF\x00\x00junk" * 10), "not a readable audio file"),
    (lambda p: sf.write(p, np.zeros(100, np.float32), SAMPLE_RATE), "fewer than one 25 ms frame"),
    (lambda p: None, "missing"),
])
def test_bad_audio_is_named_with_the_reason(tmp_path, make, message):
    path = tmp_path / "u1.wav"
    make(path)
    with pytest.raises(AudioError, match=message) as e:
        audio_features(path)
    assert str(path) in str(e.value)
