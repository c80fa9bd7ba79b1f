"""Configuration: frozen dataclasses, YAML files and dotted overrides.

Config is data, construction is code. Every section validates itself in ``__post_init__``; loading a
YAML file or an override ``a.b=c`` checks every key and type against these classes, so a typo fails
before any work with a message that names the key (and the file, when there is one). The reading and
checking machinery (types, bounds, YAML, overrides) is tformer.config_checks; its public names are importable
from here too. DecodeConfig's fields describe themselves (config_checks.option: help, bounds, per_call), so
what a request may set and the HTTP schema (tformer.serve) are read from one declaration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from tformer.config_checks import (INFERENCE_KEYS, Bounds, build, check_bounds, check_inference_overrides,  # noqa: F401
                                   merge_overrides, option, parse_override, read_yaml, request_fields, save_config,
                                   to_dict, updated)
from tformer.config_checks import check as _check
from tformer.errors import ConfigError


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
    sinusoid: Literal["interleaved", "halves", "marian", "fairseq"] = "interleaved"  # the table's layout: the
    # paper's, Hugging Face MarianMT's, Marian's C++ or fairseq's (tformer.positions.sinusoidal_table)
    scale_embedding: bool = True  # token embeddings x sqrt(d_model) before positions are added (the paper)
    max_positions: int = 1024  # rows of a learned table (learned, tupe); later positions reuse the last row
    position_offset: int = 0  # learned: unused rows before position 0's (fairseq's, mBART's: 2), kept for export
    embed_norm: bool = False  # a LayerNorm on the embeddings plus positions, before dropout (mBART, BART)
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
    output_bias: bool = True  # the output layer's bias is trained; false: held as it is (M2M-100 has none)
    start_row: int = 1  # the target table's row the decoder's first input reads: <s>'s; M2M-100's, mBART's: </s>'s

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "max_positions",
                     "feature_dim", "frame_stack", "frame_skip", "conv_channels", "max_steps", "start_row"):
            _check(getattr(self, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(self, name)}")
        _check(self.d_model % self.n_heads == 0, "model.d_model", f"{self.d_model} is not divisible by "
               f"model.n_heads={self.n_heads}; choose d_model as a multiple of n_heads")
        _check(self.position_offset >= 0, "model.position_offset", f"must be >= 0, got {self.position_offset}")
        _check(not (self.embed_norm and self.kind == "universal"), "model.embed_norm", "the universal stack adds "
               "positions at every step, so it has no embedding norm; set kind vanilla or embed_norm false")
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            _check(0.0 <= (p := getattr(self, name)) < 1.0, f"model.{name}", f"must be in [0, 1), got {p}")
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
    pairs: tuple[str, ...] = ()  # many directions in one model: 'SRC-TGT' each, from {dir}/{prefix}.{SRC} and
    # .{TGT} (or {dir}/SRC-TGT/); each source starts with its target's token (tformer.languages). Empty: one pair
    languages: tuple[str, ...] = ()  # instead of pairs: every direction between these languages (M2M-100)
    language_tag: str = "<2{}>"  # a language's token, its code in place of {}: <2fr>; M2M-100 __fr__
    tag_sides: Literal["source", "both"] = "source"  # source: the target's token starts the source (Johnson et al.);
    # both: the source's token starts it and the target's starts the output (M2M-100; tformer.languages)
    temperature: float = 1.0  # pairs: direction d drawn ~ n_d ** (1 / temperature), small ones repeated; the
    # shared SentencePiece model learns each language's text in the same proportions
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
        from tformer.languages import check_languages

        check_languages(self)
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
    ema: float = 0.0  # decay of a moving average of the weights (0 = none; 0.999): validated, used for inference
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
    best_direction: str = ""  # data.pairs: the direction whose BLEU picks the best checkpoint ('': the mean)
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
    """How to decode. Each field's metadata (config_checks.option) holds its help, its bounds (checked here) and
    whether one call may set it (per_call: a `translate` keyword, a /v1/translate field; request_fields())."""

    strategy: Literal["greedy", "beam", "sample"] = option("greedy", "the search (beam=N in a call: beam with N)",
                                                           per_call=True)
    max_len_a: float = option(1.2, "output length limit: a * source_length + b", low=0, per_call=True)
    max_len_b: int = option(10, "the b of the output length limit a * source_length + b", low=0, per_call=True)
    batch_size: int = option(250, "sentences per decoding batch", low=1)
    batch_tokens: int = option(0, "> 0: batches of at most this many padded source tokens (sentences x longest) "
                               "instead; 0: count sentences", low=0)
    prefix_score: Literal["log_prob", "zero"] = option("log_prob", "what a forced prefix's tokens add to a score: "
                                                       "log_prob (fairseq), zero (Hugging Face's forced tokens)")
    beam_finish: Literal["top_k", "all"] = option("top_k", "beam: which endings are kept", per_call=True)  # top_k:
    # </s> among a step's top K of 2K candidates (fairseq, CTranslate2, Marian); all: every finished candidate that
    # could still win, with an exact stop (t5x): outputs the model scores higher, but on Multi30k shorter and up to
    # 12 BLEU lower
    quantize: Literal["none", "int8"] = option("none", "int8: dynamic int8 linear layers (CPU; PyTorch quantization)")
    precision: Literal["fp32", "bf16", "fp16"] = option(
        "fp32", "the weights' format when loaded (tformer.precision)")  # bf16/fp16 need native units (CPU:
    # avx512_bf16 or amx_bf16; GPU: compute capability 8.0+ for bf16); log-probabilities and scores stay fp32; not
    # with quantize=int8
    beam_size: int = option(5, "K: hypotheses kept per sentence (strategy beam)", low=1, per_call=True)
    len_penalty: float = option(0.6, "alpha of the length normalisation (beam); 0 = rank by the plain sum", low=0,
                                per_call=True)
    len_penalty_rule: Literal["gnmt", "power"] = option("gnmt", "gnmt: logprob / ((5 + length) / 6) ** alpha; power: "
                                                        "logprob / length ** alpha", per_call=True)  # power:
    # Hugging Face's, Marian's, CTranslate2's and fairseq's; length counts the </s>
    min_len: int = option(0, "</s> is forbidden before this many tokens", low=0, per_call=True)
    nbest: int = option(1, "hypotheses returned per sentence (beam: <= beam_size; sample: independent draws)", low=1,
                        per_call=True)
    no_repeat_ngram: int = option(0, "forbid repeating any n-gram of this size (0 = off)", low=0, per_call=True)
    repetition_penalty: float = option(1.0, "the logits of tokens already output are divided by this where positive "
                                       "and multiplied where negative (> 1 discourages loops; 1 = off)", low=1e-3,
                                       high=1e3, per_call=True)  # CTranslate2's and Hugging Face's rule; beyond
    # these bounds the logits overflow
    unk_penalty: float = option(0.0, "lowers the <unk> logit by this before the softmax: <unk> is e^penalty times "
                                "less likely against every other token (0 = off; 1000: never in practice)", low=0,
                                high=1e3, per_call=True)  # fairseq's --unkpen (on log-probabilities), CTranslate2's
    # disable_unk and Marian's default (no --allow-unk): a model should not write a token that says "I don't know"
    temperature: float = option(1.0, "sampling only: logits / temperature", low=0, open_low=True, per_call=True)
    top_k: int = option(0, "sampling only: keep the k most probable tokens (0 = all)", low=0, per_call=True)
    top_p: float = option(1.0, "sampling only: keep the smallest set with this much probability", low=0,
                          open_low=True, high=1, per_call=True)
    seed: int = option(0, "sampling only: seeds each sentence's generator", low=0, high=2**32 - 1, per_call=True)
    compile: bool = option(False, "the decoding step compiled ahead of time (AOTInductor; CPU, fp32, one model; "
                           "about 30 s once per model and machine, then read from $TFORMER_CACHE; "
                           "tformer.model.compiled)")  # faster where PyTorch's cost per operator dominates a step:
    # small models, and several sentences (benchmarks/aot_step.py)
    shortlist: str = option("", "a lexical shortlist file (tformer shortlist; tformer.shortlist); \"\" = off")  # each
    # sentence may output only its list's target tokens, and the output projection is computed for its lists only

    def __post_init__(self) -> None:
        check_bounds(self, "decode")
        _check(self.max_len_a > 0 or self.max_len_b > 0, "decode.max_len_b",
               "max_len_a and max_len_b are both 0: nothing could be generated")
        _check(self.strategy != "beam" or self.nbest <= self.beam_size, "decode.nbest",
               f"{self.nbest} hypotheses cannot come from a beam of {self.beam_size}; raise decode.beam_size")
        _check(self.strategy != "greedy" or self.nbest == 1, "decode.nbest",
               "greedy search has one hypothesis; use decode.strategy=beam or sample for n-best lists")
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
        _check(not self.train.best_direction or self.train.best_direction in self.data.pairs, "train.best_direction",
               f"{self.train.best_direction!r} is not one of data.pairs ({', '.join(self.data.pairs) or 'none'})")
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


# --------------------------------------------------------------------------- loading (tformer.config_checks)


def from_dict(data: Mapping[str, Any] | None) -> Config:
    return build(Config, data or {}, "")


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

