"""Hard alignments (fairseq's --print-alignment, Marian's --alignment hard) against oracles: a stand-in model
whose cross-attention is written down here, the argmax of attention_maps computed by brute force (every
kernel, the universal transformer's ACT steps), the API's own teacher-forced attention on its outputs, one
sentence at a time against batches; and the command line's Marian format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tformer
from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.inspection import attention_maps, hard_alignments
from tformer.model import build_model
from tformer.model.transformer import Attentions

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1"
LINES = (V1 / "input.en").read_text(encoding="utf-8").splitlines()


# ------------------------------------------------------------------------------------------ known weights


class Scripted(torch.nn.Module):
    """A stand-in model with 2 decoder layers of 2 heads whose cross-attention is written down. A target token
    10 + a asks the query producing it to look at source position a: in the last layer head 0 puts 0.8 on a,
    head 1 puts 0.6 on a + 1 (mod n, the source pieces without </s>), both 0.1 on </s>; in layer 0 every head
    puts 0.9 on </s> and 0.1 on a + 2. Padding keys get 5.0, the rows of <pad> queries 7.0 everywhere:
    neither may ever be read. Token 9 gives a row of equal weights (a tie)."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=2)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a device for next(parameters())
        self.batches = []

    def forward(self, src, src_lengths, tgt_in, tgt_lengths, need_weights=False):
        assert need_weights
        B, S = src.shape
        T = tgt_in.shape[1]
        self.batches.append(B)
        last = torch.full((B, 2, T, S), 5.0)  # (B, H, T, S)
        first = torch.full((B, 2, T, S), 5.0)
        for b in range(B):
            n, t_len = int(src_lengths[b]) - 1, int(tgt_lengths[b])  # source pieces; <s> + target
            produced = tgt_in[b, 1:t_len].tolist()  # what query t produces (the last real query: </s>)
            last[b, :, :, :n + 1] = 0.0
            first[b, :, :, :n + 1] = 0.0
            last[b, :, t_len:], first[b, :, t_len:] = 7.0, 7.0
            for t, tok in enumerate(produced):
                if tok == 9:
                    last[b, :, t, :n] = first[b, :, t, :n] = 0.5
                    continue
                a = tok - 10
                last[b, 0, t, a], last[b, 1, t, (a + 1) % n], last[b, :, t, n] = 0.8, 0.6, 0.1
                first[b, :, t, (a + 2) % n], first[b, :, t, n] = 0.1, 0.9
        return SimpleNamespace(attentions=Attentions(cross=[first, last]), ponder=None)


def test_the_largest_head_averaged_weight_of_the_chosen_layer_wins_and_eos_padding_never_do():
    model = Scripted()
    src = [[4, 5, 6, 7], [4, 5, 6, 7, 8, 6], [5]]
    want = [[3, 0, 2], [5, 1, 0, 4, 4], [0, 0]]  # the positions each target token asks for
    pairs = [(s, [10 + a for a in w]) for s, w in zip(src, want)]
    n = [len(s) for s in src]
    for layer in (-1, 1):  # head 0's 0.8 / 2 beats head 1's 0.6 / 2
        assert hard_alignments(model, pairs, layer) == [[(a, t) for t, a in enumerate(w)] for w in want]
    assert hard_alignments(model, pairs, -1, heads=[1]) == [[((a + 1) % k, t) for t, a in enumerate(w)]
                                                           for w, k in zip(want, n)]
    assert hard_alignments(model, pairs, -1, heads=[0, 1]) == hard_alignments(model, pairs)
    # layer 0 looks hardest at </s>, which never counts: a + 2 instead
    assert hard_alignments(model, pairs, 0) == [[((a + 2) % k, t) for t, a in enumerate(w)] for w, k in zip(want, n)]
    assert hard_alignments(model, pairs, -2) == hard_alignments(model, pairs, 0)
    # a tie goes to the first source piece; an empty target has nothing to align
    assert hard_alignments(model, [([4, 5, 6], [9, 11]), ([4, 5], [])]) == [[(0, 0), (1, 1)], []]


def test_alignments_are_computed_in_batches():
    model = Scripted()
    pairs = [([4, 5, 6, 7], [10, 11, 12])] * 10
    hard_alignments(model, pairs, batch_size=4)
    assert model.batches == [4, 4, 2]
    model.batches.clear()
    hard_alignments(model, pairs, batch_size=15, batch_type="tokens")  # 3 sentences of 5 padded tokens
    assert model.batches == [3, 3, 3, 1]


@pytest.mark.parametrize("layer, heads, message", [
    (2, None, r"alignment_layer \(--alignment-layer\) must be a whole number in -2..1"),
    (-3, None, "in -2..1"),
    (1.0, None, "whole number"),
    (-1, [2], r"the model has 2 heads \(0..1\); got 2"),
    (-1, [], "non-empty list"),
    (-1, "0", "non-empty list"),
])
def test_a_layer_or_head_the_model_lacks_is_a_config_error(layer, heads, message):
    with pytest.raises(ConfigError, match=message):
        hard_alignments(Scripted(), [([4], [10])], layer, heads)


# ------------------------------------------------------------------------------------------ brute force


def _brute_force(maps, layer=-1, heads=None, steps=None):
    """The argmax over the source pieces (not </s>) of the chosen layer's (or each position's ACT step's) cross
    weights, averaged over the heads, for each target piece (not </s>), straight from AttentionMaps."""
    cross = maps.weights["cross"]  # (layers, H, T, S)
    if heads is not None:
        cross = cross[:, heads]
    out = []
    for t in range(cross.shape[2] - 1):  # the </s> query left out
        k = layer if steps is None else (min(layer, steps[t] - 1) if layer >= 0 else max(steps[t] + layer, 0))
        row = cross[k, :, t, :-1].mean(0)  # (S - 1,) the </s> key left out
        assert np.isfinite(row).all()
        out.append((int(np.argmax(row)), t))
    return out


def _model(**kw):
    cfg = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=3, dropout=0.0)
    torch.manual_seed(3)
    return build_model(ModelConfig(**{**cfg, **kw}), 20, 20).eval()


PAIRS = [([4, 5, 6, 7, 8, 9], [11, 12, 13]), ([4, 6], [5, 5, 6, 7, 4, 19]), ([7, 8, 9, 10, 11], [12]),
         ([5, 6, 7], [])]


@pytest.mark.parametrize("kw", [dict(attention="dense"), dict(attention="sdpa", norm="pre"),
                                dict(attention="graph"), dict(positions="tupe-r")])
def test_alignments_are_the_argmax_of_the_attention_maps_for_every_kernel(kw):
    model = _model(**kw)
    maps = attention_maps(model, PAIRS)
    for layer, heads in ((-1, None), (0, None), (1, [2]), (-1, [0, 3])):
        got = hard_alignments(model, PAIRS, layer, heads, batch_size=3)
        assert got == [_brute_force(m, layer, heads) for m in maps]
        assert got == [hard_alignments(model, [p], layer, heads)[0] for p in PAIRS]  # batch-independent


@pytest.mark.parametrize("attention", ["dense", "graph"])
def test_a_universal_transformer_aligns_each_position_at_its_own_act_step(attention):
    """Its positions ponder for 2 to 4 of 5 steps: step k means min(k, a position's last), -1 its last; the
    halted rows of attention_maps are NaN, so the brute force could not read a step a position never ran."""
    model = _model(kind="universal", max_steps=5, act_bias_init=-1.0, attention=attention)
    maps = attention_maps(model, PAIRS)
    steps = [m.steps[1] for m in maps]
    assert len({n for s in steps for n in s}) > 1  # positions that pondered for different numbers of steps
    for layer in (-1, 0, 1, 3, 4, -2, -5):
        got = hard_alignments(model, PAIRS, layer, batch_size=2)
        assert got == [_brute_force(m, layer, None, s) for m, s in zip(maps, steps)]
        assert got == [hard_alignments(model, [p], layer)[0] for p in PAIRS]  # however long the others pondered
    with pytest.raises(ConfigError, match="ACT steps"):
        hard_alignments(model, PAIRS, 5)


def test_a_frame_encoder_aligns_to_model_frames():
    """Frames have no </s>: every model frame (after stacking) may be the aligned source position."""
    model = _model(source="features", feature_dim=5, frame_stack=2, frame_skip=2)
    torch.manual_seed(4)
    pairs = [(torch.randn(7, 5), [5, 6, 9]), (torch.randn(4, 5), [7]), (torch.randn(9, 5), [])]
    maps = attention_maps(model, pairs)
    want = [[(int(np.argmax(m.weights["cross"][-1, :, t].mean(0))), t) for t in range(len(p[1]))]
            for m, p in zip(maps, pairs)]
    assert hard_alignments(model, pairs, batch_size=2) == want
    assert all(0 <= i < len(m.source) for w, m in zip(want, maps) for i, _ in w)


# ------------------------------------------------------------------------------------------ through the API


@pytest.fixture(scope="module")
def translator():
    return tformer.load(V1 / "checkpoint", device="cpu")


def test_translate_aligns_every_hypothesis_with_the_attention_of_its_own_output(translator):
    out = translator.translate(LINES[:8] + [""], beam=3, nbest=2, return_attention=True, alignment=True)
    for t in out[:-1]:
        for h in t.hypotheses:
            assert h.alignment == _brute_force(h.attention)
            assert [j for _, j in h.alignment] == list(range(len(h.tokens)))
            assert all(0 <= i < len(t.source_tokens) for i, _ in h.alignment)
    assert out[-1].alignment == [] and out[-1].text == ""  # an empty source: nothing decoded, nothing aligned
    assert translator.translate(LINES[:2])[0].alignment is None  # only when asked for
    heads = translator.translate(LINES[:3], alignment=True, alignment_layer=0, alignment_heads=[1],
                                 return_attention=True)
    assert [t.alignment for t in heads] == [_brute_force(t.attention, 0, [1]) for t in heads]


def test_alignments_do_not_depend_on_the_batch(translator):
    want = [t.alignment for t in translator.translate(LINES, alignment=True, batch_size=1)]
    assert [t.alignment for t in translator.translate(LINES, alignment=True, batch_size=7)] == want
    assert [t.alignment for t in translator.translate(LINES, alignment=True, batch_tokens=60)] == want
    streamed = translator.translate_iterable(iter(LINES), chunk_size=4, alignment=True)
    assert [t.alignment for t in streamed] == want


def test_score_aligns_a_given_target_as_translate_aligns_the_same_output(translator):
    out = translator.translate(LINES[:6], alignment=True, return_attention=True)
    ids = [(translator.encode(s), translator.encode(t.text, "target")) for s, t in zip(LINES[:6], out)]
    scores = translator.score(LINES[:6], [t.text for t in out], alignment=True)
    for (src, tgt), t, s in zip(ids, out, scores):
        assert s.alignment == _brute_force(attention_maps(translator.model, [(src, tgt)])[0])
        if translator.pieces(tgt) == t.tokens:  # the text tokenises back to the search's own pieces
            assert s.alignment == t.alignment


# ------------------------------------------------------------------------------------------ command line


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def _marian(alignment):
    return " ".join(f"{i}-{j}" for i, j in alignment)


def test_translate_alignment_prints_marian_lines(translator, tmp_path):
    lines = LINES[:5] + [""]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = cli("translate", "--checkpoint", V1 / "checkpoint", "--input", tmp_path / "in.en", "--alignment")
    assert r.returncode == 0, r.stderr
    want = translator.translate(lines, alignment=True)
    assert r.stdout.splitlines() == [f"{t.text} ||| {_marian(t.alignment)}" for t in want]
    assert r.stdout.splitlines()[-1] == " ||| "  # the empty line keeps its place
    r = cli("translate", "--checkpoint", V1 / "checkpoint", "--beam", "3", "--nbest", "2", "--alignment",
            "--alignment-layer", "0", "--alignment-heads", "0,1", stdin="\n".join(lines[:3]) + "\n")
    assert r.returncode == 0, r.stderr
    want = translator.translate(lines[:3], beam=3, nbest=2, alignment=True, alignment_layer=0)
    assert r.stdout.splitlines() == [f"{i} ||| {h.text} ||| {h.score:.4f} ||| {_marian(h.alignment)}"
                                      for i, t in enumerate(want) for h in t.hypotheses]
    r = cli("translate", "--checkpoint", V1 / "checkpoint", "--alignment", "--alignment-layer", "4", stdin="a\n")
    assert r.returncode == 2 and "--alignment-layer" in r.stderr and "-1..0" in r.stderr
