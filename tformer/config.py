"""Configuration: frozen dataclasses, YAML files and dotted overrides.

Config is data, construction is code. Every section validates itself in ``__post_init__``; loading a
YAML file or an override ``a.b=c`` checks every key and type against these classes, so a typo fails
before any work with a message that names the key (and the file, when there is one).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from tformer.errors import ConfigError


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")


@dataclass(frozen=True)
class StructureConfig:
    """Which positions of a sentence self-attention connects (see tformer.structures); default: all."""

    window: int = 0  # keys within +-window positions; 0 = no limit
    dilation: int = 1  # step between window positions (window 0: every dilation-th position)
    global_tokens: int = 0  # the first positions attend to, and are attended by, every position
    edges: str = ""  # a file of 'query key' position pairs, or module:function(length) -> pairs

    def __post_init__(self) -> None:
        for name in ("window", "global_tokens"):
            _check(getattr(self, name) >= 0, f"structure.{name}", f"must be >= 0, got {getattr(self, name)}")
        _check(self.dilation >= 1, "structure.dilation", f"must be >= 1, got {self.dilation}")
        _check(not self.edges or (self.window, self.dilation, self.global_tokens) == (0, 1, 0),
               "structure.edges", "an edge list is the whole pattern; leave window, dilation and global_tokens unset")


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 256  # D: the width of embeddings, attention and every residual stream
    n_heads: int = 4  # H: attention heads per layer (d_model must be a multiple)
    kv_heads: int = 0  # G: key/value heads, each shared by n_heads / G query heads (grouped-query attention;
    # 1: multi-query); 0 = n_heads, plain multi-head. The decoder's cache holds G heads, not n_heads
    d_ff: int = 1024  # the feed-forward network's inner width
    encoder_layers: int = 3  # layers of the encoder stack (universal: the most steps is max_steps instead)
    decoder_layers: int = 3  # layers of the decoder stack
    dropout: float = 0.1  # embeddings (+positions) and every residual branch
    attention_dropout: float = 0.1  # attention weights
    ffn_dropout: float = 0.1  # inside the FFN, after the activation
    activation: Literal["relu", "gelu", "silu"] = "relu"  # silu: swish, x sigmoid(x) (Marian's OPUS-MT models)
    norm: Literal["post", "pre"] = "post"  # post: the paper; pre: Annotated Transformer / DGL (+ final norm)
    layer_norm_eps: float = 1e-5  # epsilon of every LayerNorm (Marian's imported models: 1e-6)
    norm_layer: Literal["layernorm", "rmsnorm"] = "layernorm"  # the residual branches' norms and the final one;
    # rmsnorm: x / sqrt(mean(x^2) + eps) * g, no centring and no bias (Zhang and Sennrich 2019)
    ffn: Literal["standard", "glu"] = "standard"  # glu: (activation(x W) * x V) W2, a gated FFN (Shazeer 2020):
    # SwiGLU with activation silu, GEGLU with gelu; W and V are d_ff wide each (d_ff = 2/3 of 4 d_model keeps
    # the parameter count of a standard FFN 4 d_model wide)
    qk_norm: bool = False  # RMSNorm (with a learned gain) on every head's queries and keys before their dot
    # product, in self- and cross-attention (QK-norm, Dehghani et al. 2023): bounded scores, steadier training
    positions: Literal["sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi", "rotary", "none"] = (
        "sinusoidal")  # encoder and decoder; sinusoidal, learned: added to the embeddings; tupe, tupe-r, relative
    # (T5's buckets, no absolute term), alibi (a linear distance penalty): added to the self-attention scores;
    # rotary: RoPE, self-attention queries and keys rotated by position; none: no positions (a causal decoder
    # only). See tformer.positions
    decoder_positions: Literal["", "sinusoidal", "learned", "tupe", "tupe-r", "relative", "alibi", "rotary",
                               "none"] = ""  # the decoder's own scheme; "" = as model.positions
    sinusoid: Literal["interleaved", "halves", "marian"] = "interleaved"  # the sinusoidal table's layout: the
    # paper's (sin, cos interleaved), Hugging Face MarianMT's (sines, then cosines) or Marian's C++ (sines, then
    # cosines, other frequencies); see tformer.positions.sinusoidal_table
    scale_embedding: bool = True  # token embeddings x sqrt(d_model) before positions are added (the paper)
    max_positions: int = 1024  # rows of a learned table (learned, tupe); later positions reuse the last row
    untie_first: bool = False  # tupe: learned bias values for the first token's row and column ([CLS] reset)
    relative_buckets: int = 32  # tupe-r, relative: buckets of relative distance (bidirectional: half per direction)
    relative_max_distance: int = 128  # tupe-r, relative: distances from here on share the last bucket
    rotary_layout: Literal["interleaved", "halves"] = "interleaved"  # rotary: dimension pairs (2i, 2i+1)
    # (RoFormer, GPT-J) or (i, i + Dh/2) (GPT-NeoX, Hugging Face's Llama)
    rotary_base: float = 10000.0  # rotary: theta_i = base^(-2i/Dh)
    source: Literal["tokens", "features"] = "tokens"  # encoder input: token ids, or float frames (B, S, F)
    feature_dim: int = 80  # features: F, the values per input frame
    frame_stack: int = 1  # features: consecutive frames concatenated into one model frame
    frame_skip: int = 1  # features: input frames between the starts of two model frames (S' = ceil(S / skip))
    frontend: Literal["stack", "conv"] = "stack"  # features: low frame rate stacking (frame_stack, frame_skip;
    # Speech-Transformer's LFR) or two strided 3x3 convolutions over (time, frequency), 4x fewer frames
    conv_channels: int = 64  # frontend conv: channels of both convolutions
    ctc: bool = False  # features: a CTC output layer on the encoder, trained beside the decoder (joint CTC/attention,
    # weight train.ctc_weight): it teaches the encoder to align frames with characters early in training
    cmvn: bool = False  # features: subtract the training frames' mean and divide by their std per value (global
    # CMVN), with statistics computed when the corpus is prepared and kept in the model
    attention: Literal["sdpa", "dense", "graph"] = "sdpa"  # kernel; may change after training (graph: packed,
    # no padding, attention as message passing over edges)
    encoder_structure: StructureConfig = field(default_factory=StructureConfig)  # encoder self-attention
    decoder_structure: StructureConfig = field(default_factory=StructureConfig)  # decoder self-attn (+ causal)
    kind: Literal["vanilla", "universal"] = "vanilla"  # universal: one shared layer per side, repeated, with
    # ACT halting per position (encoder_layers / decoder_layers are then ignored)
    max_steps: int = 8  # universal: most recurrent steps per position
    act_epsilon: float = 0.01  # universal: a position halts once its summed halting probability passes 1 - this
    act_bias_init: float = 1.0  # universal: initial bias of the halting units (higher: halt sooner)
    share_embeddings: bool = False  # one table for source and target (needs a joint vocabulary)
    tie_generator: bool = True  # output projection shares the target embedding

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "max_positions",
                     "feature_dim", "frame_stack", "frame_skip", "conv_channels"):
            _check(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        _check(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            f"{self.d_model} is not divisible by model.n_heads={self.n_heads}; "
            "choose d_model as a multiple of n_heads",
        )
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            p = getattr(self, name)
            _check(0.0 <= p < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")
        _check(self.max_steps >= 1, "model.max_steps", f"must be >= 1, got {self.max_steps}")
        _check(0.0 < self.act_epsilon < 1.0, "model.act_epsilon", f"must be in (0, 1), got {self.act_epsilon}")
        _check(self.kv_heads >= 0 and (self.kv_heads == 0 or self.n_heads % self.kv_heads == 0), "model.kv_heads",
               f"must divide model.n_heads={self.n_heads} (or be 0: as many as n_heads), got {self.kv_heads}")
        rotary = "rotary" in (self.side_positions("encoder"), self.side_positions("decoder"))
        _check(not rotary or (self.d_model // self.n_heads) % 2 == 0, "model.positions",
               f"rotary turns pairs of dimensions: the head size d_model / n_heads must be even, got "
               f"{self.d_model // self.n_heads}")
        _check(self.side_positions("encoder") != "none", "model.positions",
               "'none' leaves the encoder without positions: self-attention without a causal mask is "
               "permutation-equivariant, so it would read a sentence as a bag of tokens; use positions 'none' "
               "for the decoder only (model.decoder_positions=none), whose causal mask lets it infer order")
        _check(self.relative_buckets >= 4, "model.relative_buckets", f"must be >= 4, got {self.relative_buckets}")
        _check(self.relative_max_distance > self.relative_buckets // 2, "model.relative_max_distance",
               f"must exceed relative_buckets // 2 = {self.relative_buckets // 2} (the exact buckets), "
               f"got {self.relative_max_distance}")

    @property
    def frame_rate(self) -> int:
        """Input frames per model frame: an utterance of S frames is ceil(S / frame_rate) model frames."""
        return 4 if self.frontend == "conv" else self.frame_skip

    def side_positions(self, side: str) -> str:
        """The position scheme of 'encoder' or 'decoder'."""
        return self.decoder_positions or self.positions if side == "decoder" else self.positions


@dataclass(frozen=True)
class DataConfig:
    task: Literal["copy", "sort", "reverse", "text", "translation", "speech", "synthetic_speech"] = "copy"  # what to learn:
    # a synthetic task generated in-process, pre-tokenised text files, raw parallel text, or speech frames

    # synthetic tasks (copy, sort, reverse): DGL's sizes and symbols, lengths ~ Normal(mean, std) clipped
    symbols: int = 26  # 'a', 'b', ... then 's26', 's27', ... beyond 26
    length_distribution: Literal["normal", "uniform"] = "normal"  # of train and valid; uniform: every length in
    # [min_len, max_len] equally likely. The test splits do not follow it: test is DGL's, test_uniform uniform
    length_mean: float = 15.0  # synthetic tasks: mean of the normal length distribution
    length_std: float = 3.0  # synthetic tasks: its standard deviation
    min_len: int = 1  # synthetic tasks: the shortest sequence (lengths are clipped to [min_len, max_len])
    max_len: int = 30  # synthetic tasks: the longest sequence
    train_size: int = 9000  # synthetic tasks, synthetic_speech: sequences in the training split
    valid_size: int = 1000  # ... in the validation split
    test_size: int = 1000  # ... in each test split
    seed: int = 1  # generates the synthetic data; splits a tsv corpus; samples the tokenizer's training pairs

    # task 'text': a folder with {train,valid,test}.{src,tgt}, one whitespace-tokenised sequence per line
    dir: str = ""  # the corpus folder (text, translation with format files, speech)

    # task 'translation': raw (untokenised) parallel text, SentencePiece trained on the training split.
    # format 'files': {dir}/{prefix}.{lang} or .{lang}.gz per split, line i translating line i;
    # format 'tsv': one tab-separated file split by source sentence into train/valid/test with `seed`.
    format: Literal["files", "tsv"] = "files"  # translation: one file per split and language, or one tsv file
    src_lang: str = "en"  # translation: the source language's file suffix ({prefix}.{src_lang})
    tgt_lang: str = "de"  # ... and the target's
    train_prefix: str = "train"  # translation files: the training split's name ({dir}/{train_prefix}.{lang})
    valid_prefix: str = "valid"  # ... the validation split's
    test_prefix: str = "test"  # ... the test split's
    tsv: str = ""  # format tsv: the path of the tab-separated file
    tsv_columns: tuple[int, int] = (0, 1)  # 0-based columns of source and target
    subword: Literal["bpe", "unigram"] = "bpe"  # the SentencePiece model type
    subword_sampling: float = 0.0  # training side only: re-segment each training pair at every use, seeded by
    # (train.seed, epoch, batch): BPE-dropout with this probability (bpe), or sampling with this alpha (unigram)
    vocab_size: int = 8000  # pieces per SentencePiece model, the 4 specials included
    joint_vocab: bool = True  # one model for both sides (needed by model.share_embeddings)
    character_coverage: float = 1.0  # SentencePiece: the share of characters the vocabulary must cover
    filter_max_len: int = 250  # training pairs with a side longer than this (in pieces) are dropped
    filter_max_ratio: float = 0.0  # ... or with longer/shorter side above this; 0 = no ratio filter

    # translation corpora are encoded once into memory-mapped shards (tformer prepare; see tformer.data.prepared):
    prepared: str = ""  # a folder `tformer prepare` wrote; empty: prepare into the cache ($TFORMER_CACHE) as needed
    tokenizer_sample: int = 1_000_000  # SentencePiece learns from this many training pairs (seeded by data.seed; 0 = all)
    shard_size: int = 100_000  # raw pairs per shard (the unit of parallel encoding and of resuming a prepare)
    workers: int = 0  # encoding processes (0 = one per CPU core)

    # task 'speech': {dir}/{prefix}.tsv per split, lines 'id<TAB>transcript'; per utterance {dir}/{id}.wav, .flac
    # or .ogg (16 kHz mono: model.feature_dim log-mel filterbanks are computed), or {dir}/{id}.npy, a float array
    # (frames, model.feature_dim). Features are computed once into memory-mapped shards (tformer.data.features)
    feature_dtype: Literal["float16", "float32"] = "float16"  # speech: how prepared features are stored
    speech_shard_size: int = 1000  # speech: utterances per prepared shard (the unit of resuming a prepare)
    target_units: Literal["char", "subword"] = "char"  # speech targets: characters, or SentencePiece pieces
    max_frames: int = 0  # speech: utterances with more input frames are an error (0 = no limit)

    # task 'synthetic_speech': symbols (the first 26 letters) grouped into words; each letter becomes a block
    # of noisy frames around its prototype, a space a block of noise alone (see tformer.data.speech)
    min_frames: int = 3  # frames per letter or space, drawn uniformly from min_frames .. max_symbol_frames
    max_symbol_frames: int = 8  # synthetic_speech: the most frames per letter or space
    gap_frames: int = 0  # up to this many noise frames between letters (0 = none); below min_frames
    noise: float = 1.0  # std of the Gaussian noise on every frame (prototypes have unit variance)

    def __post_init__(self) -> None:
        _check(self.symbols >= 1, "data.symbols", f"must be >= 1, got {self.symbols}")
        _check(1 <= self.min_len <= self.max_len, "data.min_len",
               f"need 1 <= min_len <= max_len, got {self.min_len} and {self.max_len}")
        _check(self.length_std >= 0, "data.length_std", f"must be >= 0, got {self.length_std}")
        _check(0.0 <= self.subword_sampling < 1.0, "data.subword_sampling",
               f"must be in [0, 1) (0: off), got {self.subword_sampling}")
        _check(not self.subword_sampling or self.task == "translation", "data.subword_sampling",
               f"re-segments SentencePiece subwords: data.task 'translation' only, not '{self.task}'")
        _check(self.length_distribution in ("normal", "uniform"), "data.length_distribution",
               f"must be 'normal' or 'uniform', got {self.length_distribution!r}")
        _check(self.length_distribution == "normal" or self.task in SYNTHETIC_TASKS, "data.length_distribution",
               f"applies to the synthetic tasks ({', '.join(SYNTHETIC_TASKS)}); data.task '{self.task}' does not draw lengths")
        for name in ("train_size", "valid_size", "test_size"):
            _check(getattr(self, name) >= 1, f"data.{name}", f"must be >= 1, got {getattr(self, name)}")
        _check(self.task not in ("text", "translation") or self.format == "tsv" or bool(self.dir), "data.dir",
               f"task '{self.task}' needs data.dir, the folder with the corpus files")
        _check(self.task != "translation" or self.format != "tsv" or bool(self.tsv), "data.tsv",
               "format 'tsv' needs data.tsv, the path of the tab-separated file")
        _check(self.vocab_size >= 8, "data.vocab_size", f"must be >= 8, got {self.vocab_size}")
        _check(min(self.tsv_columns) >= 0 and self.tsv_columns[0] != self.tsv_columns[1], "data.tsv_columns",
               f"must be two different 0-based columns, got {list(self.tsv_columns)}")
        _check(self.filter_max_len >= 1, "data.filter_max_len", f"must be >= 1, got {self.filter_max_len}")
        _check(self.filter_max_ratio == 0 or self.filter_max_ratio >= 1, "data.filter_max_ratio",
               f"must be 0 (off) or >= 1, got {self.filter_max_ratio}")
        _check(self.tokenizer_sample >= 0, "data.tokenizer_sample", f"must be >= 0 (0 = all), got {self.tokenizer_sample}")
        _check(self.shard_size >= 1, "data.shard_size", f"must be >= 1, got {self.shard_size}")
        _check(self.speech_shard_size >= 1, "data.speech_shard_size", f"must be >= 1, got {self.speech_shard_size}")
        _check(self.workers >= 0, "data.workers", f"must be >= 0 (0 = one per core), got {self.workers}")
        _check(not self.prepared or self.task in ("translation", "speech"), "data.prepared",
               f"a prepared corpus holds a translation or speech task, but data.task is '{self.task}'")
        _check(0 < self.character_coverage <= 1, "data.character_coverage",
               f"must be in (0, 1], got {self.character_coverage}")
        _check(self.task != "speech" or bool(self.dir), "data.dir",
               "task 'speech' needs data.dir, the folder with {train,valid,test}.tsv and the .npy frames")
        _check(self.max_frames >= 0, "data.max_frames", f"must be >= 0, got {self.max_frames}")
        _check(1 <= self.min_frames <= self.max_symbol_frames, "data.min_frames",
               f"need 1 <= min_frames <= max_symbol_frames, got {self.min_frames} and {self.max_symbol_frames}")
        _check(0 <= self.gap_frames < self.min_frames, "data.gap_frames",
               f"must be in [0, min_frames={self.min_frames}) so a gap cannot pass for a space, got {self.gap_frames}")
        _check(self.noise >= 0, "data.noise", f"must be >= 0, got {self.noise}")
        _check(self.task != "synthetic_speech" or self.symbols <= 26, "data.symbols",
               f"synthetic_speech transcribes letters: at most 26 symbols, got {self.symbols}")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1  # initial weights, dropout and the batch order (a resume continues it exactly)
    max_tokens: int = 4096  # token budget per batch: sentences x longest side (padded), BOS/EOS included
    max_sentences: int = 0  # 0 = no limit
    epochs: int = 20  # passes over the training data (whichever of epochs, max_steps, max_hours ends first)
    max_steps: int = 0  # optimizer updates; 0 = no limit
    max_hours: float = 0.0  # stop (after saving) once the run's wall time, evaluations included, reaches this
    accum_steps: int = 1  # batches per optimizer update
    schedule: Literal["noam", "inverse_sqrt", "constant"] = "noam"  # the learning rate over updates: noam is
    # lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); inverse_sqrt peaks at lr after warmup
    lr: float = 1.0  # noam: the factor; inverse_sqrt/constant: the peak learning rate
    warmup: int = 4000  # updates of linear warm-up
    betas: tuple[float, float] = (0.9, 0.98)  # Adam's (beta1, beta2), the paper's
    adam_eps: float = 1e-9  # Adam's epsilon, the paper's
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 = plain Adam
    clip_norm: float = 1.0  # 0 = no clipping
    label_smoothing: float = 0.1  # probability mass spread over the other tokens of the target vocabulary
    ema: float = 0.0  # decay of an exponential moving average of the weights (0 = none; e.g. 0.999): validated,
    # checkpointed (ema.safetensors) and used for inference beside the raw weights (tformer/training/ema.py)
    ponder_weight: float = 0.01  # universal transformer: tau, the weight of the ACT ponder cost in the loss
    eval_every: int = 0  # optimizer updates between evaluations; 0 = once per epoch
    log_every: int = 20  # optimizer updates between log lines (and metrics.jsonl records)
    keep_last: int = 3  # checkpoints kept besides the best
    keep_best: int = 0  # also keep this many best-validated checkpoints (for `tformer average --best N`)
    save_every: int = 0  # optimizer updates between checkpoints without an evaluation; 0 = at evaluations only
    max_bad_updates: int = 5  # an update whose loss or gradients are NaN/inf is skipped; stop after this many in a row
    deterministic: bool = False  # torch.use_deterministic_algorithms: GPU runs repeat exactly (CPU runs already do)
    target_exact_match: float = 0.0  # stop once validation exact match reaches this (0 = never)
    patience: int = 0  # stop after this many evaluations without a better best checkpoint (0 = never)
    valid_beam: int = 1  # beam size of the validation BLEU decode (1 = greedy, the fastest)
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when PyTorch sees a GPU, else cpu

    # the forward pass under torch.autocast in this dtype (weights, gradients, optimizer stay float32); fp16 adds
    # a dynamic gradient scaler, kept in checkpoints. On a CPU, bf16 needs AVX-512 BF16 or AMX (Zen 4, Cooper Lake and
    # later) and fp16 AVX-512 FP16 or AMX-FP16; without them it runs far slower, and training warns (the log names
    # the units it found and what it chose)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    compile: bool = False  # the model's forward through torch.compile (inductor), compiled in the first update
    # (logged; cached on disk); where it cannot compile, the run says why and goes on eager (training/compile.py)
    attention_examples: int = 0  # record the attention of this many validation examples at every evaluation
    # (RUN_DIR/attention/, animated by `tformer animate`)
    tensorboard: bool = False  # also log the metrics to RUN_DIR/tensorboard (needs the tensorboard package)
    random_positions: int = 0  # randomised positions: train on positions drawn from 0 .. N-1, fresh per batch,
    # under any scheme (inference reads 0 .. L-1); N well past the training lengths (e.g. 10x) lets short examples
    # teach the positions of long ones. 0 = off. See tformer.positions.RandomPositions
    random_draw: Literal["sorted", "shift"] = "sorted"  # random_positions: sorted, L distinct positions (Ruoss et
    # al. 2023); shift, L consecutive ones from a random start (SHAPE, Kiyono et al. 2021)
    ctc_weight: float = 0.3  # model.ctc: loss = ctc_weight x CTC + (1 - ctc_weight) x attention (ESPnet's mtlalpha)
    freq_masks: int = 0  # SpecAugment (features, training only): bands of feature values set to the mean, each
    # up to freq_mask_width wide; seeded by (seed, update, rank, micro-batch), so a resumed run masks the same
    freq_mask_width: int = 27  # SpecAugment: the widest frequency mask (values)
    time_masks: int = 0  # SpecAugment: spans of frames set to the mean, each up to time_mask_width frames and
    # time_mask_ratio of the utterance
    time_mask_width: int = 40  # SpecAugment: the longest time mask (input frames)
    time_mask_ratio: float = 0.2  # SpecAugment: a time mask covers at most this share of its utterance
    init_from: str = ""  # fine-tune: start from this model (a run or checkpoint folder, or a Hugging Face / Marian
    # folder), with its architecture and tokenizers; the optimizer and the step start afresh (tformer.training.start)

    def __post_init__(self) -> None:
        for name in ("max_tokens", "epochs", "accum_steps", "log_every", "keep_last", "valid_beam",
                     "max_bad_updates"):
            _check(getattr(self, name) >= 1, f"train.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("max_sentences", "max_steps", "warmup", "eval_every", "save_every", "threads", "patience",
                     "attention_examples", "keep_best"):
            _check(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(self, name)}")
        _check(self.lr > 0, "train.lr", f"must be > 0, got {self.lr}")
        _check(self.max_hours >= 0, "train.max_hours", f"must be >= 0, got {self.max_hours}")
        _check(self.schedule != "noam" or self.warmup >= 1, "train.warmup", "noam needs warmup >= 1")
        _check(all(0 <= b < 1 for b in self.betas), "train.betas", f"must be in [0, 1), got {self.betas}")
        _check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing",
               f"must be in [0, 1), got {self.label_smoothing}")
        _check(self.clip_norm >= 0, "train.clip_norm", f"must be >= 0, got {self.clip_norm}")
        _check(0.0 <= self.ema < 1.0, "train.ema", f"is a decay in [0, 1) (0: no average), got {self.ema}")
        _check(self.ponder_weight >= 0, "train.ponder_weight", f"must be >= 0, got {self.ponder_weight}")
        _check(self.random_positions >= 0, "train.random_positions", f"must be >= 0 (0 = off), got "
               f"{self.random_positions}")
        for name in ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width"):
            _check(getattr(self, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(self, name)}")
        _check(0.0 <= self.ctc_weight < 1.0, "train.ctc_weight", f"is a share in [0, 1), got {self.ctc_weight}")
        _check(0.0 < self.time_mask_ratio <= 1.0, "train.time_mask_ratio",
               f"is a share of the utterance in (0, 1], got {self.time_mask_ratio}")
        _check(0.0 <= self.target_exact_match <= 1.0, "train.target_exact_match",
               f"is a fraction in [0, 1], got {self.target_exact_match}")


@dataclass(frozen=True)
class DecodeConfig:
    strategy: Literal["greedy", "beam", "sample"] = "greedy"  # the search (beam=N in a call: beam with N)
    max_len_a: float = 1.2  # output length limit: a * source_length + b
    max_len_b: int = 10  # ... the b of that limit
    batch_size: int = 250  # sentences per decoding batch
    batch_tokens: int = 0  # > 0: batches of at most this many padded source tokens (sentences x longest) instead
    beam_finish: Literal["top_k", "all"] = "top_k"  # beam: which endings are kept. top_k: </s> among a step's top
    # K of 2K candidates (fairseq, CTranslate2, Marian); all: every finished candidate that could still win, with
    # an exact stop (t5x): outputs the model scores higher, but on Multi30k shorter and up to 12 BLEU lower
    quantize: Literal["none", "int8"] = "none"  # int8: dynamic int8 linear layers (CPU; PyTorch quantization)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # the weights' format when loaded (tformer.precision):
    # bf16/fp16 need native units (CPU: avx512_bf16 or amx_bf16; GPU: compute capability 8.0+ for bf16);
    # log-probabilities and scores stay fp32; not with quantize=int8
    beam_size: int = 5  # K: hypotheses kept per sentence (strategy beam)
    len_penalty: float = 0.6  # alpha of the length normalisation (beam); 0 = rank by the plain sum
    len_penalty_rule: Literal["gnmt", "power"] = "gnmt"  # gnmt: logprob / ((5 + length) / 6) ** alpha; power:
    # logprob / length ** alpha (Hugging Face, Marian, CTranslate2, fairseq); length counts the </s>
    min_len: int = 0  # </s> is forbidden before this many tokens
    nbest: int = 1  # hypotheses returned per sentence (beam: <= beam_size; sample: independent draws)
    no_repeat_ngram: int = 0  # forbid repeating any n-gram of this size (0 = off)
    repetition_penalty: float = 1.0  # the logits of tokens already output are divided by this where positive and
    # multiplied where negative (CTranslate2's and Hugging Face's rule; > 1 discourages loops; 1 = off)
    temperature: float = 1.0  # sampling only
    top_k: int = 0  # sampling only: keep the k most probable tokens (0 = all)
    top_p: float = 1.0  # sampling only: keep the smallest set with this much probability
    seed: int = 0  # sampling only
    shortlist: str = ""  # a lexical shortlist file (tformer shortlist; tformer.shortlist): each sentence may output
    # only its list's target tokens, and the output projection is computed for the batch's lists only; "" = off

    def __post_init__(self) -> None:
        _check(self.max_len_a >= 0, "decode.max_len_a", f"must be >= 0, got {self.max_len_a}")
        _check(self.max_len_b >= 0, "decode.max_len_b", f"must be >= 0, got {self.max_len_b}")
        _check(self.max_len_a > 0 or self.max_len_b > 0, "decode.max_len_b",
               "max_len_a and max_len_b are both 0: nothing could be generated")
        _check(self.batch_size >= 1, "decode.batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.batch_tokens >= 0, "decode.batch_tokens", f"must be >= 0 (0: count sentences), got "
               f"{self.batch_tokens}")
        for name in ("beam_size", "nbest"):
            _check(getattr(self, name) >= 1, f"decode.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("min_len", "no_repeat_ngram", "top_k"):
            _check(getattr(self, name) >= 0, f"decode.{name}", f"must be >= 0, got {getattr(self, name)}")
        _check(self.strategy != "beam" or self.nbest <= self.beam_size, "decode.nbest",
               f"{self.nbest} hypotheses cannot come from a beam of {self.beam_size}; raise decode.beam_size")
        _check(self.strategy != "greedy" or self.nbest == 1, "decode.nbest",
               "greedy search has one hypothesis; use decode.strategy=beam or sample for n-best lists")
        _check(self.len_penalty >= 0, "decode.len_penalty", f"must be >= 0, got {self.len_penalty}")
        _check(self.temperature > 0, "decode.temperature", f"must be > 0, got {self.temperature}")
        _check(1e-3 <= self.repetition_penalty <= 1e3, "decode.repetition_penalty",
               f"must be > 0, from 0.001 to 1000 (1 = off, > 1 discourages repeats; beyond, logits overflow), got "
               f"{self.repetition_penalty}")
        _check(0 < self.top_p <= 1, "decode.top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.precision == "fp32" or self.quantize == "none", "decode.precision",
               f"{self.precision} with decode.quantize={self.quantize}: int8 layers take fp32 inputs, so the two do "
               f"not combine; choose one (decode.precision=fp32 with int8, or decode.quantize=none)")


SPEECH_TASKS = ("speech", "synthetic_speech")
SYNTHETIC_TASKS = ("copy", "sort", "reverse")  # generated in-process from data.seed (tformer.data.synthetic)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        speech = self.data.task in SPEECH_TASKS
        _check(speech == (self.model.source == "features"), "model.source",
               f"data.task '{self.data.task}' reads {'frames' if speech else 'token ids'}: set model.source="
               f"{'features' if speech else 'tokens'}")
        _check(not (speech and self.model.share_embeddings), "model.share_embeddings",
               "a frame encoder has no source embeddings to share")
        _check(not self.model.ctc or self.model.source == "features", "model.ctc",
               "CTC aligns long inputs with shorter outputs: it is built for frame encoders (model.source=features)")
        _check(not self.model.ctc or self.train.ctc_weight > 0, "train.ctc_weight",
               "model.ctc has a CTC layer that nothing would train with train.ctc_weight=0; give it a weight "
               "(0.3 is ESPnet's) or set model.ctc=false")
        augment = self.train.freq_masks or self.train.time_masks
        _check(not augment or self.model.source == "features", "train.freq_masks",
               "SpecAugment masks feature frames: a model that reads tokens (model.source=tokens) has none")
        _check(self.train.freq_mask_width < self.model.feature_dim or not self.train.freq_masks,
               "train.freq_mask_width", f"must be below model.feature_dim={self.model.feature_dim}, got "
               f"{self.train.freq_mask_width}")
        n, m = self.train.random_positions, self.model
        tables = {"learned", "tupe", "tupe-r"} & {m.side_positions("encoder"), m.side_positions("decoder")}
        _check(not (n and tables) or n <= m.max_positions, "train.random_positions",
               f"draws positions up to {n - 1}, past the learned table of model.max_positions={m.max_positions} "
               f"rows ({', '.join(sorted(tables))}): raise model.max_positions to at least {n}")
        _check(not (n and m.untie_first), "train.random_positions",
               "model.untie_first unties position 0, which randomised positions rarely draw: use one or the other")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> "Config":
        """A YAML recipe, by path or by the name of a packaged recipe ('copy', 'multi30k_en_de'; see
        tformer.recipes), with dotted overrides such as 'train.max_steps=500' applied on top. Errors name the
        key and whether it came from the file or the overrides."""
        from tformer.recipes import find_recipe

        return load_config(find_recipe(path), overrides)

    def to_yaml(self) -> str:
        """Every setting as YAML: what `--print-config` shows and what a run folder's config.yaml holds."""
        return yaml.safe_dump(to_dict(self), sort_keys=False)


# What a fine-tuning run (train.init_from) may set in its model section: regularisation and the kernel. The rest
# is the initial model's architecture, which its weights and tokenizers fix (tformer.training.start).
FINE_TUNABLE = ("dropout", "attention_dropout", "ffn_dropout", "attention")


def same_architecture(a: ModelConfig, b: ModelConfig) -> bool:
    """Equal but for the FINE_TUNABLE keys: the weights of one fit, and mean the same in, the other."""
    return dataclasses.replace(a, **{k: getattr(b, k) for k in FINE_TUNABLE}) == b

# Settings that may change after training: `translate` and `evaluate` accept overrides for these alone. Where
# the corpus lives may change too (a moved folder), and which list is the test split (a speech corpus's noisy
# copy, another test set); a prepared corpus is checked against the checkpoint's tokenizer.
INFERENCE_KEYS = ("decode.", "model.attention", "data.dir", "data.prepared", "data.test_prefix")


# --------------------------------------------------------------------------- loading and checking


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it converted (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        _check(value in choices, key, f"must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key)
    if origin is tuple:
        args = typing.get_args(tp)
        _check(isinstance(value, (list, tuple)) and len(value) == len(args), key,
               f"must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string; it is meant as a number
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
               f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")  # an invariant of this module


def _unknown_key(prefix: str, key: Any, names: list[str]) -> ConfigError:
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
    return ConfigError(f"config key '{prefix}{key}' is unknown{hint}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<top>'}': must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(prefix, key, names)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (tuples become lists) that YAML writes and `from_dict` reads back."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def from_dict(data: Mapping[str, Any] | None) -> Config:
    return _build(Config, data or {}, "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.d_model=512` -> (['model', 'd_model'], 512); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form section.key=value (e.g. model.d_model=512)")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2 or not all(path):
        raise ConfigError(f"override '{text}': the key must be section.key, e.g. train.lr=2.0")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': the value is not valid YAML ({e})") from None
    return path, value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (data or {}).items()}
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
        node[path[-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data or {}


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file <- overrides; errors name the key and the file."""
    file_data = read_yaml(path) if path else {}
    try:
        return from_dict(merge_overrides(file_data, list(overrides)))
    except ConfigError as e:
        try:  # say where the bad key came from: the file, or the command line
            from_dict(file_data)
        except ConfigError as file_error:
            if str(file_error) == str(e):
                raise ConfigError(f"{e} (in {path})") from None
        raise ConfigError(f"{e} (from the command-line overrides)" if overrides else str(e)) from None


def check_inference_overrides(overrides: list[str]) -> None:
    """Only decoding and kernel settings may change on a trained model."""
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in INFERENCE_KEYS):
            raise ConfigError(
                f"config key '{key}' cannot change after training; only decode.*, model.attention, data.dir, "
                "data.prepared and data.test_prefix can"
            )


def save_config(cfg: Config, path: str | Path) -> None:
    """Write `cfg` as YAML under a temporary name, then rename it into place (never half a file)."""
    from tformer.files import replace_atomically

    with replace_atomically(path) as f:
        f.write(cfg.to_yaml())


def updated(section: Any, prefix: str, values: Mapping[str, Any]) -> Any:
    """The frozen config `section` with `values` in place of its fields, each key and type checked as a YAML
    file's would be and the section validated again; errors name `prefix.key` (e.g. 'decode.beam_size')."""
    names = [f.name for f in dataclasses.fields(section)]
    hints = typing.get_type_hints(type(section))
    changes = {}
    for key, value in values.items():
        if key not in names:
            raise _unknown_key(f"{prefix}.", key, names)
        changes[key] = _coerce(value, hints[key], f"{prefix}.{key}")
    return dataclasses.replace(section, **changes)
