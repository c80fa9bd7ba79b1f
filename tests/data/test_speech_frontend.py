"""Real audio into the speech encoder: prepared feature shards against on-the-fly features, bad audio refused
with nothing written, CMVN, the convolutional front end, SpecAugment, audio through the Translator and the
transcribe command, and the espeak-ng spoken corpus."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch

sf = pytest.importorskip("soundfile")
pytest.importorskip("kaldi_native_fbank")

from tformer.config import Config, ConfigError, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from tformer.data.audio import SAMPLE_RATE, FbankOptions, fbank  # noqa: E402
from tformer.data.features import PreparedFeatures, prepare_features  # noqa: E402
from tformer.data.speech import SpeechDataError, read_speech_split  # noqa: E402
from tformer.data.specaugment import SpecAugment  # noqa: E402
from tformer.model import build_model  # noqa: E402
from tformer.model.embeddings import ConvSubsampler  # noqa: E402

F = 40  # filterbank bins in these tests (model.feature_dim)


def tone(seconds: float, freq: float, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = 0.01 * np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * np.sin(2 * math.pi * freq * t) + noise).astype(np.float32)


def audio_corpus(folder, n=6, kinds=(".flac", ".wav")):
    """n utterances per split: tones whose pitch spells the transcript's first letter; audio files alternate kinds."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        lines = []
        for i in range(n):
            letter = "ab"[i % 2]
            path = folder / f"{split}{i}{kinds[i % len(kinds)]}"
            sf.write(path, tone(0.3 + 0.05 * i, 300 if letter == "a" else 1200, seed=i), SAMPLE_RATE,
                     subtype="PCM_16")
            lines.append(f"{split}{i}\t{letter} {letter}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def data_cfg(folder, **kw):
    return DataConfig(task="speech", dir=str(folder), speech_shard_size=4, workers=1, **kw)


# --------------------------------------------------------------------------- prepared shards


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_prepared_audio_shards_equal_features_computed_on_the_fly(tmp_path, dtype):
    corpus = audio_corpus(tmp_path / "c")
    cfg = data_cfg(corpus, feature_dtype=dtype)
    prepared = prepare_features(cfg, tmp_path / "p", F, ["train", "valid"])
    direct = read_speech_split(cfg, "train", F)  # reads the audio and computes fbank now
    frames = prepared.frames("train")
    assert len(frames) == 6 and len(prepared.manifest["splits"]["train"]) and prepared.entry("train")["shards"] == 2
    ids, texts = prepared.texts("train")
    assert ids == direct.ids and texts == direct.transcripts
    for got, want in zip(frames, direct.frames):
        assert got.dtype == torch.float32 and got.shape == want.shape
        if dtype == "float32":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want.half().float(), rtol=0, atol=0)
    every = torch.cat(direct.frames).double()  # CMVN over every training frame, in float64
    mean, std = prepared.cmvn
    torch.testing.assert_close(mean.double(), every.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(std.double(), every.std(0, unbiased=False), rtol=1e-5, atol=1e-5)
    assert prepared.verify() == []
    frames.release()  # pages handed back to the page cache; reading maps them again
    assert all(torch.equal(a, b) for a, b in zip(frames, prepared.frames("train")))


def test_an_interrupted_prepare_keeps_its_finished_shards_and_completes(tmp_path):
    corpus = audio_corpus(tmp_path / "c")
    cfg = data_cfg(corpus)
    whole = prepare_features(cfg, tmp_path / "whole", F, ["train"])
    prepare_features(cfg, tmp_path / "part", F, ["train"])
    receipt = tmp_path / "part" / "train" / "00001.json"
    receipt.unlink()  # shard 1 as if the process had died before its receipt
    kept = (tmp_path / "part" / "train" / "00000.feat.npy").stat().st_mtime_ns
    again = prepare_features(cfg, tmp_path / "part", F, ["train"])
    assert (tmp_path / "part" / "train" / "00000.feat.npy").stat().st_mtime_ns == kept  # not recomputed
    assert receipt.exists()
    assert all(torch.equal(a, b) for a, b in zip(whole.frames("train"), again.frames("train")))
    other = data_cfg(corpus, feature_dtype="float32")
    with pytest.raises(Exception, match="other settings"):
        prepare_features(other, tmp_path / "part", F, ["train"])


@pytest.mark.parametrize("damage,message", [
    (lambda p: sf.write(p, np.zeros((4800, 2), np.float32), SAMPLE_RATE), "2 channels"),
    (lambda p: sf.write(p, np.zeros(2400, np.float32), 8000), "sampled at 8000 Hz"),
    (lambda p: sf.write(p, np.zeros(0, np.float32), SAMPLE_RATE, format="WAV"), "holds no samples"),
    (lambda p: p.write_bytes(b"fLaC" + b"\x00" * 40), "not a readable audio file"),
    (lambda p: p.unlink(), "is missing"),
])
def test_bad_audio_is_named_with_its_line_and_nothing_is_written(tmp_path, damage, message):
    corpus = audio_corpus(tmp_path / "c")
    damage(corpus / "train4.flac")  # line 5 of train.tsv
    with pytest.raises(SpeechDataError, match=message) as e:
        prepare_features(data_cfg(corpus), tmp_path / "p", F, ["train", "valid"])
    assert "train.tsv, line 5: utterance 'train4'" in str(e.value)
    assert not any(p.is_file() for p in (tmp_path / "p").rglob("*"))  # no shard, no manifest


def test_a_truncated_recording_is_named_and_the_other_shards_are_kept(tmp_path):
    """Damage past the header shows only when the samples are decoded: that shard fails, naming the line."""
    corpus = audio_corpus(tmp_path / "c", kinds=(".wav",))
    data = (corpus / "train5.wav").read_bytes()
    (corpus / "train5.wav").write_bytes(data[:60])  # the header promises samples that are not there
    with pytest.raises(Exception, match="line 6: utterance 'train5'"):
        prepare_features(data_cfg(corpus), tmp_path / "p", F, ["train"])
    assert (tmp_path / "p" / "train" / "00000.json").exists()  # utterances 0-3 are kept
    assert not (tmp_path / "p" / "train" / "00001.json").exists()


# --------------------------------------------------------------------------- the front end


def frame_model(**kw):
    m = ModelConfig(source="features", feature_dim=F, d_model=32, n_heads=4, d_ff=64, encoder_layers=1,
                    decoder_layers=1, dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0, **kw)
    torch.manual_seed(0)
    return build_model(m, 4, 12).eval()


def test_low_frame_rate_stacking_equals_slicing_each_utterance():
    """LFR m/n against a direct reference: model frame i of an utterance of S frames concatenates its frames
    i*n .. i*n+m-1, the last real frame standing in past its end; in a padded batch, for every m, n and S."""
    from tformer.model.embeddings import stack_frames

    g = torch.Generator().manual_seed(0)
    for m in range(1, 6):
        for n in range(1, 5):
            lengths = [1, 2, 5, 9, 14]
            batch = torch.randn(len(lengths), max(lengths), 3, generator=g)
            out, counts = stack_frames(batch, torch.tensor(lengths), m, n)
            for b, S in enumerate(lengths):
                x = batch[b, :S]
                ref = torch.stack([torch.cat([x[min(i * n + j, S - 1)] for j in range(m)])
                                   for i in range(math.ceil(S / n))])
                assert int(counts[b]) == ref.shape[0]
                assert torch.equal(out[b, : ref.shape[0]], ref)


def test_cmvn_in_the_model_equals_normalising_the_frames_first():
    plain, normed = frame_model(), frame_model(cmvn=True)
    normed.load_state_dict({**plain.state_dict(), **{k: v for k, v in normed.state_dict().items() if "cmvn" in k}})
    mean, std = torch.randn(F), torch.rand(F) + 0.5
    normed.src_embed.set_cmvn(mean, std)
    x, n = torch.randn(2, 30, F) * 3 + 1, torch.tensor([30, 21])
    tgt = torch.tensor([[1, 5, 6], [1, 7, 0]])
    a = normed(x, n, tgt, torch.tensor([3, 2])).hidden
    b = plain((x - mean) / std, n, tgt, torch.tensor([3, 2])).hidden
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert set(k for k in normed.state_dict() if "cmvn" in k) == {"src_embed.cmvn_mean", "src_embed.cmvn_scale"}


def test_conv_front_end_divides_the_frames_by_four_and_ignores_padding():
    conv = ConvSubsampler(F, 8, 32)
    for s in range(1, 40):
        out, n = conv(torch.randn(1, s, F), torch.tensor([s]))
        assert out.shape == (1, math.ceil(s / 4), 32) and int(n) == math.ceil(s / 4)
    assert ModelConfig(frontend="conv").frame_rate == 4  # what batching counts
    alone = [torch.randn(1, s, F) for s in (13, 29, 4)]
    batch = torch.zeros(3, 29, F)
    for i, a in enumerate(alone):
        batch[i, : a.shape[1]] = a
    batch[0, 13:] = 100.0  # padding with junk in it must not leak into real frames
    out, n = conv(batch, torch.tensor([13, 29, 4]))
    for i, a in enumerate(alone):
        one, m = conv(a, torch.tensor([a.shape[1]]))
        assert int(n[i]) == int(m)
        torch.testing.assert_close(out[i, : int(m)], one[0], rtol=1e-5, atol=1e-5)


def test_a_conv_model_decodes_the_same_alone_and_in_a_batch():
    from tformer.config import DecodeConfig
    from tformer.inference import translate_ids

    model = frame_model(frontend="conv", cmvn=True)
    model.src_embed.set_cmvn(torch.zeros(F), torch.ones(F) * 2)
    frames = [torch.randn(s, F) for s in (17, 40, 9, 23)]
    for search in (DecodeConfig(max_len_a=0.5, max_len_b=3),
                   DecodeConfig(strategy="beam", beam_size=3, max_len_a=0.5, max_len_b=3)):
        together = translate_ids(model, frames, search)
        alone = [translate_ids(model, [f], search) for f in frames]
        assert together.tokens == [a.tokens[0] for a in alone]
        np.testing.assert_allclose(np.array(together.scores, dtype=float),
                                   np.array([a.scores[0] for a in alone], dtype=float), rtol=1e-4)


def ctc_reference(log_probs: np.ndarray, labels: list[int], blank: int = 0) -> float:
    """-log p(labels | frames) by CTC's forward recursion over the blank-extended labels (Graves et al. 2006),
    in float64. log_probs (S, V)."""
    ext = [blank]
    for y in labels:
        ext += [y, blank]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = log_probs[0, blank]
    if len(ext) > 1:
        alpha[1] = log_probs[0, ext[1]]
    for t in range(1, log_probs.shape[0]):
        new = np.full(len(ext), -np.inf)
        for s in range(len(ext)):
            terms = [alpha[s]] + ([alpha[s - 1]] if s >= 1 else [])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(alpha[s - 2])
            new[s] = np.logaddexp.reduce(terms) + log_probs[t, ext[s]]
        alpha = new
    return -float(np.logaddexp(alpha[-1], alpha[-2]) if len(ext) > 1 else alpha[-1])


@pytest.mark.parametrize("attention", ["sdpa", "graph"])
def test_ctc_loss_equals_the_forward_recursion_over_each_utterance(attention):
    from tformer.training.loss import ctc_loss

    model = frame_model(ctc=True, attention=attention)
    src, n = torch.randn(3, 40, F), torch.tensor([40, 25, 31])
    targets = [[5, 6, 6, 7], [8, 9], [4, 10, 11, 4, 5]]  # a repeated label needs a blank between its copies
    T = max(len(t) for t in targets) + 1
    tgt_out = torch.zeros(3, T, dtype=torch.long)
    for b, t in enumerate(targets):
        tgt_out[b, : len(t) + 1] = torch.tensor(t + [2])  # ids + </s>
    lengths = torch.tensor([len(t) + 1 for t in targets])
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), tgt_out[:, :-1]], 1)
    out = model(src, n, tgt_in, lengths)
    got = float(ctc_loss(model, out.encoder, tgt_out, lengths).detach())
    enc = frame_model(ctc=True).encode(src, n)  # the padded layout's frames, for the reference
    ref = 0.0
    for b, t in enumerate(targets):
        frames = int(enc.mask[b].sum())
        lp = torch.log_softmax(model.ctc(enc.memory[b, :frames]).double(), -1).detach().numpy()
        ref += ctc_reference(lp, t)
    assert got == pytest.approx(ref, rel=1e-4)


def test_a_target_longer_than_its_frames_costs_nothing_in_ctc():
    """ctc_loss documents it: a target that cannot align with its frames (more labels than frames) costs nothing
    rather than infinity, so the batch's loss is the other utterances' and every gradient stays finite."""
    from tformer.training.loss import ctc_loss

    model = frame_model(ctc=True)
    src, n = torch.randn(2, 40, F), torch.tensor([40, 3])
    enc = model.encode(src, n)
    frames = enc.mask.sum(1).tolist()
    targets = [[5, 6, 7], list(range(4, 12)) * 2]  # 16 labels, past the second utterance's frames
    assert len(targets[1]) > frames[1]
    T = max(len(t) for t in targets) + 1
    tgt_out = torch.zeros(2, T, dtype=torch.long)
    for b, t in enumerate(targets):
        tgt_out[b, : len(t) + 1] = torch.tensor(t + [2])
    loss = ctc_loss(model, enc, tgt_out, torch.tensor([len(t) + 1 for t in targets]))
    lp = torch.log_softmax(model.ctc(enc.memory[0, : frames[0]]).double(), -1).detach().numpy()
    assert float(loss.detach()) == pytest.approx(ctc_reference(lp, targets[0]), rel=1e-4)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_ctc_settings_are_checked():
    with pytest.raises(ConfigError, match="model.ctc"):
        Config(model=ModelConfig(ctc=True))
    with pytest.raises(ConfigError, match="train.ctc_weight"):
        Config(model=ModelConfig(source="features", ctc=True), data=DataConfig(task="synthetic_speech"),
               train=TrainConfig(ctc_weight=0.0))


# --------------------------------------------------------------------------- SpecAugment


def test_spec_augment_masks_stay_in_bounds_and_are_seeded():
    aug = SpecAugment(freq_masks=2, freq_mask_width=7, time_masks=3, time_mask_width=10, time_mask_ratio=0.2)
    counts = torch.tensor([100, 40, 7, 1])
    masked_somewhere = torch.zeros(4, dtype=torch.bool)
    for step in range(200):
        m = aug.masks(counts, 100, F, 1, step, 0, 0)  # (B, S, F)
        for b, c in enumerate(counts.tolist()):
            assert not m[b, c:].any()  # never the padding
            full_rows = m[b, :c].all(dim=1)  # frames masked across every value: the time masks
            bands = m[b, :c].all(dim=0) if c else torch.zeros(F, dtype=torch.bool)  # values masked on every frame
            assert int(bands.sum()) <= 2 * 7
            assert int(full_rows.sum()) <= 3 * min(10, math.floor(0.2 * c))
            masked_somewhere[b] |= m[b].any()
    assert masked_somewhere.all()
    a, b = aug.masks(counts, 100, F, 1, 5, 0, 0), aug.masks(counts, 100, F, 1, 5, 0, 0)
    assert torch.equal(a, b)
    assert not torch.equal(a, aug.masks(counts, 100, F, 1, 6, 0, 0))  # another update
    assert not torch.equal(a, aug.masks(counts, 100, F, 2, 5, 0, 0))  # another seed
    frames = torch.randn(4, 100, F)
    fill = torch.randn(F)
    out = aug(frames, counts, 1, 5, 0, 0, fill=fill)
    assert torch.equal(out[~a], frames[~a]) and torch.equal(out[a], fill.expand_as(frames)[a])


def test_spec_augment_settings_are_checked():
    with pytest.raises(ConfigError, match="train.freq_masks"):
        Config(train=TrainConfig(freq_masks=2))  # a text model has no frames
    with pytest.raises(ConfigError, match="train.time_mask_ratio"):
        TrainConfig(time_mask_ratio=0)
    with pytest.raises(ConfigError, match="train.freq_mask_width"):
        Config(model=ModelConfig(source="features", feature_dim=20), data=DataConfig(task="synthetic_speech"),
               train=TrainConfig(freq_masks=1, freq_mask_width=20))


def _speech_config(corpus, steps, **train):
    cfg = Config.from_yaml("speech_tupe", [f"data.dir={corpus}", f"model.feature_dim={F}", "model.d_model=32",
                                           "model.d_ff=64", "model.n_heads=2", "model.encoder_layers=1",
                                           "model.decoder_layers=1", "train.warmup=10", "train.max_hours=0",
                                           "data.speech_shard_size=4", "data.workers=1", "train.freq_mask_width=8",
                                           "train.time_mask_width=5", "train.max_tokens=60", "train.threads=1",
                                           "model.ctc=true", "train.ctc_weight=0.3"])
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=steps, eval_every=steps, epochs=50,
                                                              **train))


def test_training_with_spec_augment_resumes_exactly_and_evaluation_never_masks(tmp_path):
    from tformer import load, train

    corpus = audio_corpus(tmp_path / "c")

    def weights(run):
        return load(run, which="latest", device="cpu").model.state_dict()

    train(_speech_config(corpus, 6), tmp_path / "whole")
    train(_speech_config(corpus, 3), tmp_path / "part")
    train(_speech_config(corpus, 6), tmp_path / "part", resume=True)
    whole, part = weights(tmp_path / "whole"), weights(tmp_path / "part")
    assert all(torch.equal(whole[k], part[k]) for k in whole)
    train(_speech_config(corpus, 6, freq_masks=0, time_masks=0), tmp_path / "off")
    off = weights(tmp_path / "off")
    assert not all(torch.equal(whole[k], off[k]) for k in whole if "cmvn" not in k)  # the masks changed the updates
    assert torch.equal(whole["src_embed.cmvn_mean"], off["src_embed.cmvn_mean"])  # the corpus's statistics
    t = load(tmp_path / "whole", which="latest", device="cpu")
    first, second = t.evaluate("valid"), t.evaluate("valid")  # no masks at evaluation: the same twice
    assert first.outputs == second.outputs and first.metrics["cer"] == second.metrics["cer"]
    # ... and the same as the unmasked frames give where masking cannot happen (seeded masks would also repeat):
    # forced decoding of the references (Translator.score, which never sees train.*) gives evaluation's nll,
    # decoding the frames gives its outputs
    data = t.load_split("valid")
    frames = [src for src, _ in data.examples["valid"]]
    scores = t.score(frames, first.references)
    nll = -sum(s.log_prob for s in scores) / sum(len(s.tokens) for s in scores)
    assert first.metrics["nll"] == pytest.approx(nll, rel=1e-5)
    assert first.outputs == [x.text for x in t.translate(frames)]


def test_audio_reaches_the_translator_and_transcribe_as_files_waveforms_and_frames(tmp_path, capsys):
    from tformer import load, train
    from tformer.cli import main

    corpus = audio_corpus(tmp_path / "c")
    train(_speech_config(corpus, 4), tmp_path / "run")
    t = load(tmp_path / "run", which="latest", device="cpu")
    wav = corpus / "test1.wav"
    samples, _ = sf.read(wav, dtype="float32")
    feats = fbank(samples, FbankOptions(num_mel_bins=F))
    by_path, by_wave, by_frames = (t.translate([x])[0].text for x in (str(wav), samples, feats))
    assert by_path == by_wave == by_frames
    # a model this young may say the same for any input: the forced-decoding scores show that the three forms
    # reach the model as the same frames, and that the scores do hear a change of scale (another recording)
    targets = ["b b", "a a", by_path]
    scores = [[s.token_log_probs for s in t.score([x] * len(targets), targets)]
              for x in (str(wav), samples, feats, 0.5 * samples)]
    assert scores[0] == scores[1] == scores[2]
    assert all(a != b for a, b in zip(scores[3], scores[0]))
    assert main(["transcribe", "--checkpoint", str(tmp_path / "run"), str(wav), str(corpus / "test0.flac")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"test1\t{by_path}" and lines[1].startswith("test0\t")
    assert main(["transcribe", "--checkpoint", str(tmp_path / "run"), "--tsv", str(corpus / "test.tsv")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"test1\t{by_path}"
    with pytest.raises(Exception, match="sampled at 8000 Hz"):
        sf.write(tmp_path / "low.wav", np.zeros(800, np.float32), 8000)
        t.translate([str(tmp_path / "low.wav")])
    with pytest.raises(Exception, match="fewer than one 25 ms frame"):
        t.translate([np.zeros(100, np.float32)])
    [best] = t.translate([str(wav)], return_attention=True)
    model_frames = math.ceil(fbank(samples, FbankOptions(num_mel_bins=F)).shape[0] / 3)  # LFR 4/3
    assert best.attention.weights["cross"].shape[-1] == model_frames
    assert best.attention.source[:3] == ["0.00s", "0.03s", "0.06s"]  # keys against time: 3 x 10 ms per frame
    assert main(["attention", "--checkpoint", str(tmp_path / "run"), "--audio", str(wav), "--kind", "cross",
                 "--format", "png", "--out", str(tmp_path / "pics")]) == 0
    assert f"{model_frames} model frames" in capsys.readouterr().out
    assert (tmp_path / "pics" / "cross_layer0_heads.png").stat().st_size > 1000
    assert main(["attention", "--checkpoint", str(tmp_path / "run"), "--sentence", "a b"]) == 2
    assert "give --audio" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--json", "--beam", "2"]) == 0
    assert "cer" in json.loads(capsys.readouterr().out.splitlines()[-1])


def test_a_universal_speech_model_maps_its_act_steps_over_the_recording(tmp_path, capsys):
    from tformer import train
    from tformer.cli import main

    corpus = audio_corpus(tmp_path / "c")
    cfg = _speech_config(corpus, 2)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kind="universal", max_steps=3,
                                                             positions="sinusoidal", decoder_positions=""))
    train(cfg, tmp_path / "ut")
    assert main(["ponder", "--checkpoint", str(tmp_path / "ut"), "--audio", str(corpus / "test3.wav"), "--out",
                 str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    steps = [int(x) for x in out.split("steps per source token: [")[1].split("]")[0].split(",")]
    n = math.ceil(fbank(sf.read(corpus / "test3.wav", dtype="float32")[0], FbankOptions(num_mel_bins=F)).shape[0] / 3)
    assert len(steps) == n and all(1 <= k <= 3 for k in steps)  # one per model frame, none past max_steps
    assert (tmp_path / "p" / "step_map.png").stat().st_size > 1000


# --------------------------------------------------------------------------- the spoken corpus


def needs_espeak():
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (bash scripts/install-espeak.sh installs it)")


SENTENCES = [f"{w} is here today.\tx" for w in ("Tom", "Mary", "The cat", "A dog", "My friend", "Your boss",
                                                 "The teacher", "Her mother", "His car", "Our train", "Their house",
                                                 "The doctor")] + ["I have 3 cats.", "Ça va ?", "Hi."]


def test_transcripts_keep_letters_apostrophes_and_spaces_only():
    from tformer.data.spoken import transcript

    assert transcript("Don't go, Tom!\tNe pars pas !") == "don't go tom"
    assert transcript("It's a well-known \u2018fact\u2019.") == "it's a well known fact"
    assert transcript("I have 3 cats.") is None and transcript("Ça va ?") is None


def test_spoken_corpus_is_split_by_sentence_seeded_and_resumable(tmp_path):
    needs_espeak()
    from tformer.data.spoken import SpokenSettings, build_spoken_corpus, synthesize

    s = SpokenSettings(train=6, valid=2, test=2, renditions=2, snrs=(10.0,), min_chars=3, workers=1)
    corpus = build_spoken_corpus(SENTENCES, tmp_path / "a", s, progress=False)
    assert corpus.splits == {"train": 12, "valid": 2, "test": 2, "test_snr10": 2}
    lists = {p: (tmp_path / "a" / f"{p}.tsv").read_text().splitlines() for p in corpus.splits}
    text = {p: {line.split("\t")[1] for line in lines} for p, lines in lists.items()}
    assert not text["train"] & text["test"] and not text["train"] & text["valid"] and not text["valid"] & text["test"]
    assert text["test"] == text["test_snr10"] and len(text["train"]) == 6
    manifest = json.loads((tmp_path / "a" / "spoken.json").read_text())
    assert manifest["espeak_ng"].startswith("eSpeak NG") and manifest["settings"]["snrs"] == [10.0]
    for line in lists["train"] + lists["test"]:
        info = sf.info(tmp_path / "a" / f"{line.split(chr(9))[0]}.flac")
        assert (info.samplerate, info.channels) == (SAMPLE_RATE, 1) and info.duration > 0.3
    rows = [r.split("\t") for r in (tmp_path / "a" / "utterances.tsv").read_text().splitlines()[1:]]
    noisy = next(r for r in rows if r[0].startswith("test_snr10/"))
    clean_twin = next(r for r in rows if r[0] == noisy[0].replace("test_snr10", "test"))
    assert noisy[1:4] == clean_twin[1:4] and noisy[4] == "10" and clean_twin[4] == "clean"
    clean, _ = sf.read(tmp_path / "a" / f"{clean_twin[0]}.flac")
    dirty, _ = sf.read(tmp_path / "a" / f"{noisy[0]}.flac")
    snr = 10 * np.log10(np.mean(clean**2) / np.mean((dirty - clean) ** 2))
    assert abs(snr - 10.0) < 0.5  # the noise added is 10 dB below the speech
    reference = synthesize(noisy[5], noisy[1], int(noisy[2]), int(noisy[3]))
    np.testing.assert_allclose(clean, reference, atol=1.5 / 32768)  # espeak-ng's reading, resampled, 16-bit
    first = tmp_path / "a" / "train" / "000003.flac"
    data = first.read_bytes()
    first.unlink()
    (tmp_path / "a" / "train.tsv").unlink()  # as if stopped before the lists
    build_spoken_corpus(SENTENCES, tmp_path / "a", s, progress=False)
    assert first.read_bytes() == data and (tmp_path / "a" / "train.tsv").read_text().splitlines() == lists["train"]
    with pytest.raises(Exception, match="distinct usable sentences"):
        build_spoken_corpus(SENTENCES, tmp_path / "b", dataclasses.replace(s, train=20), progress=False)


def test_the_spoken_command_writes_a_corpus_the_recipe_trains_on(tmp_path, capsys):
    needs_espeak()
    from tformer.cli import main

    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    assert main(["data", "spoken", "--text", str(text), "--out", str(tmp_path / "s"), "--train", "6", "--valid", "2",
                 "--test", "2", "--renditions", "1", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "train.tsv: 6 utterances" in out and "now: tformer train --config speech_tupe" in out
    assert main(["prepare", "--config", "speech_tupe", "--out", str(tmp_path / "p"), f"data.dir={tmp_path / 's'}",
                 "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert PreparedFeatures.open(tmp_path / "p").entry("train")["utterances"] == 6
    assert main(["data", "spoken", "--out", str(tmp_path / "t")]) == 2
    assert "needs --text" in capsys.readouterr().err
