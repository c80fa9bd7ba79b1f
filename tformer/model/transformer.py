"""The encoder-decoder Transformer ("Attention Is All You Need"), as a composition:

    src_embed, tgt_embed   tokens or frames, with absolute positions (tformer.model.embeddings)
    src_bias, tgt_bias     the positional attention bias (TUPE, relative, ALiBi), once per forward (tformer.positions)
    encoder, decoder       a stack of layers (tformer.model.stack) or the universal transformer's ACT stack:
                           one shared layer with per-position halting (tformer.model.act)
    generator              the output projection

Each side's input is prepared in one place for every kind of encoder or decoder (`source`, `target`):
embeddings, positions, the layout, the self-attention structure and the bias.

Notation: B batch, S source length, T target length, Ns / Nt real source / target tokens, D model dim,
H heads, Dh head dim, V vocabulary, E edges.

    encode(src, src_lengths)            -> EncoderOutput(memory (B, S, D) or packed (1, Ns, D), mask (B, S))
    forward(src, ..., tgt_in, ...)      -> ModelOutput; out.real() (Nt, D) real target positions,
                                           logits = generator(out.real())
    init_cache(encoder_output)          -> DecoderCache (tformer.model.cache)
    decode_step(tokens (B,), cache)     -> (logits (B, V), cache): one position, for tformer.decode

The encoder reads token ids, or float frames (B, S, F) with `model.source: features`.

Two layouts, one set of parameters (tformer.model.layout). With `model.attention: dense | sdpa` sentences are
padded to (B, L) and structures are boolean masks. With `model.attention: graph` the batch is packed: all real
tokens of the batch in one row (1, N, D), no padding anywhere, and every attention is message passing over a
graph (tformer.masks.Graph): source tokens fully connected, target tokens causally connected, every source
token of a sentence to every target token of that sentence (the DGL seed's three graphs), or the sparse
structures of `model.encoder_structure` / `model.decoder_structure`. Callers pass padded tensors in both
layouts; packing is an index on token ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.masks import Graph
from tformer.model.act import ACTStack
from tformer.model.cache import DecoderCache
from tformer.model.embeddings import Embeddings, FrameEmbeddings, Span
from tformer.model.layers import DecoderLayer, EncoderLayer
from tformer.model.layout import Layout, Packed, Padded, Step
from tformer.model.output import Projection, restricted_linear
from tformer.model.stack import LayerStack, Side, final_norm
from tformer.norms import build_norm
from tformer.positions import RandomPositions, Rotary, build_attention_bias, build_positions
from tformer.structures import Structure, build_structure

if TYPE_CHECKING:
    from tformer.model.compiled import CompiledStep
    from tformer.model.act import Ponder


@dataclass
class Attentions:
    """Attention weights per layer, returned when asked for: (B, H, queries, keys) each in the padded layout;
    (E, H), one row per edge of `graphs[kind]`, in the packed layout (see `tformer.masks.Graph.dense`)."""

    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)
    graphs: dict[str, Graph] = field(default_factory=dict)  # "encoder", "decoder", "cross" (packed layout)


class EncoderOutput(NamedTuple):
    memory: Tensor  # (B, S, D), or (1, Ns, D) when packed
    mask: Tensor  # (B, S) bool, True at real tokens
    attentions: list[Tensor] | None = None
    graph: Graph | None = None  # the encoder's self-attention graph (packed layout)
    ponder: "Ponder | None" = None  # ACT statistics per source position (universal transformer)
    layout: Layout | None = None  # how memory lies (its cross-attention structure comes from it)

    @property
    def packed(self) -> bool:
        return self.graph is not None


class ModelOutput(NamedTuple):
    hidden: Tensor  # (B, T, D) decoder output before the generator, or (1, Nt, D) when packed
    mask: Tensor  # (B, T) bool, True at real target positions
    attentions: Attentions | None = None
    packed: bool = False
    ponder: "tuple[Ponder, Ponder] | None" = None  # ACT statistics, (source, target) (universal transformer)
    encoder: EncoderOutput | None = None  # what the decoder read (forward sets it; the CTC loss reads it)

    def real(self) -> Tensor:
        """(Nt, D): the real target positions, sentence after sentence (what the loss reads)."""
        return self.hidden[0] if self.packed else self.hidden[self.mask]

    def padded(self) -> Tensor:
        """(B, T, D), zeros at padding (in either layout: a padded stack's final norm leaves its bias there)."""
        if not self.packed:
            return self.hidden.masked_fill(~self.mask[..., None], 0.0)
        out = self.hidden.new_zeros(*self.mask.shape, self.hidden.shape[-1])
        out[self.mask] = self.hidden[0]
        return out


def build_stack(cfg: ModelConfig, side: str) -> LayerStack | ACTStack:
    """The encoder or decoder `cfg.kind` asks for: a stack of layers, or one shared layer with ACT halting."""
    layer = EncoderLayer if side == "encoder" else DecoderLayer
    norm = final_norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.norm_layer)
    if cfg.kind == "universal":
        return ACTStack(layer(cfg), norm, cfg.d_model, cfg.max_steps, cfg.act_epsilon, cfg.act_bias_init)
    return LayerStack([layer(cfg) for _ in range(getattr(cfg, f"{side}_layers"))], norm)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab != tgt_vocab:
            raise ConfigError(
                f"model.share_embeddings needs one joint vocabulary, but the source has {src_vocab} "
                f"entries and the target {tgt_vocab}"
            )
        if cfg.start_row >= tgt_vocab:
            raise ConfigError(f"model.start_row={cfg.start_row} is past the target vocabulary's {tgt_vocab} entries")
        self.cfg = cfg
        D = cfg.d_model
        enc_kind, dec_kind = cfg.side_positions("encoder"), cfg.side_positions("decoder")
        table = dict(max_positions=cfg.max_positions, sinusoid=cfg.sinusoid, skip=cfg.position_offset)
        positions = build_positions(enc_kind, D, **table)  # no weights when sinusoidal
        shared = enc_kind == dec_kind == "sinusoidal"
        tgt_positions = positions if shared else build_positions(dec_kind, D, **table)
        tgt_tokens = nn.Embedding(tgt_vocab, D)
        once = cfg.kind != "universal"  # the ACT stack adds positions at every step itself
        if cfg.source == "features":  # src_vocab is unused: frames are projected, not looked up
            self.src_embed: Embeddings | FrameEmbeddings = FrameEmbeddings(cfg, positions, once)
        else:
            src_tokens = tgt_tokens if cfg.share_embeddings else nn.Embedding(src_vocab, D)
            self.src_embed = Embeddings(src_tokens, positions, cfg.dropout, once, cfg.scale_embedding,
                                        build_norm("layernorm", D, cfg.layer_norm_eps) if cfg.embed_norm else None)
        self.tgt_embed = Embeddings(tgt_tokens, tgt_positions, cfg.dropout, once, cfg.scale_embedding,
                                    build_norm("layernorm", D, cfg.layer_norm_eps) if cfg.embed_norm else None,
                                    cfg.start_row)
        bias = dict(d_model=D, n_heads=cfg.n_heads, max_positions=cfg.max_positions, untie_first=cfg.untie_first,
                    buckets=cfg.relative_buckets, max_distance=cfg.relative_max_distance)
        self.src_bias = build_attention_bias(enc_kind, causal=False, **bias)  # TUPE, relative, ALiBi; else None
        self.tgt_bias = build_attention_bias(dec_kind, causal=True, **bias)
        self.encoder = build_stack(cfg, "encoder")
        self.decoder = build_stack(cfg, "decoder")
        self.generator = nn.Linear(D, tgt_vocab)
        self.ctc = nn.Linear(D, tgt_vocab) if cfg.ctc else None  # blank: the padding id (never a target)
        self.encoder_structure = build_structure(cfg.encoder_structure)
        self.decoder_structure = build_structure(cfg.decoder_structure)
        self.compiled_step: CompiledStep | None = None  # decode_step compiled ahead of time (decode.compile), which
        # translation then runs in its place (tformer.model.compiled; set at load by tformer.inference.model_from)
        self.reset_parameters()
        if cfg.tie_generator:
            self.generator.weight = tgt_tokens.weight
        self.generator.bias.requires_grad_(cfg.output_bias)

    def reset_parameters(self) -> None:
        """Xavier/Glorot uniform for every matrix (the paper's code); LayerNorm 1/0, biases 0; then whatever an
        encoder or decoder starts differently (the halting units)."""
        own = {id(p) for stack in (self.encoder, self.decoder) if isinstance(stack, ACTStack)
               for p in stack.halt.parameters()}
        for name, p in self.named_parameters():
            if id(p) in own:
                continue
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        self.encoder.reset_parameters()
        self.decoder.reset_parameters()

    @property
    def packed(self) -> bool:
        """True when attention runs on graphs over packed tokens (model.attention: graph)."""
        return self.cfg.attention == "graph"

    def layout(self, lengths: Tensor, length: int, positions: Tensor | None = None) -> Layout:
        """The layout of a side's batch; `positions` (>= L,): the slots' positions (randomised, in training),
        else 0 .. L-1."""
        return (Packed if self.packed else Padded)(lengths, length, None if positions is None else positions[:length])

    def _side(self, embed: Embeddings | FrameEmbeddings, inputs: Tensor, layout: Layout, structure: Structure,
              causal: bool, bias: nn.Module | None) -> Side:
        """What every encoder or decoder reads: embeddings at their positions in `layout`, its self-attention
        structure and TUPE's bias (over the longest sentence: padded width, or the longest packed one)."""
        e = embed(layout.take(inputs), layout.positions())
        L = layout.length if not layout.packed else int(layout.lengths.max())
        table = None if bias is None else bias.at(layout.slot_positions(L), layout.slot_positions(L))  # (H, L, L)
        rotary = self._rotary("decoder" if causal else "encoder", layout.positions(), e.x.device)
        return Side(e.x, e.positions, layout, layout.self_mask(structure, causal), layout.bias(table), rotary)

    def _rotary(self, side: str, positions: Tensor | Span, device: torch.device) -> Rotary | None:
        """RoPE's angles for rows at `positions` (a Span: every sentence alike; a tensor (1, N): packed)."""
        if self.cfg.side_positions(side) != "rotary":
            return None
        if isinstance(positions, Span):
            positions = torch.arange(positions.start, positions.stop, device=device)
        return Rotary.build(positions.reshape(-1), self.cfg.d_model // self.cfg.n_heads, self.cfg.rotary_base,
                            self.cfg.rotary_layout)  # (L, Dh/2) each

    def source(self, src: Tensor, src_lengths: Tensor, positions: Tensor | None = None) -> Side:
        """src (B, S) token ids, or (B, S, F) float frames (S' = model frames after stacking)."""
        if isinstance(self.src_embed, FrameEmbeddings):
            src, src_lengths = self.src_embed.frames(src, src_lengths)  # (B, S', D), model frames per utterance
        layout = self.layout(src_lengths, src.shape[1], positions)
        return self._side(self.src_embed, src, layout, self.encoder_structure, False, self.src_bias)

    def target(self, tgt_in: Tensor, tgt_lengths: Tensor, positions: Tensor | None = None) -> Side:
        layout = self.layout(tgt_lengths, tgt_in.shape[1], positions)
        return self._side(self.tgt_embed, tgt_in, layout, self.decoder_structure, True, self.tgt_bias)

    def encode(self, src: Tensor, src_lengths: Tensor, need_weights: bool = False,
               positions: Tensor | None = None) -> EncoderOutput:
        """src (B, S) token ids, or (B, S, F) float frames; src_lengths (B,) -> memory (B, S, D) (S' model
        frames for features), or (1, Ns, D) packed. `positions` (>= S,): the slots' positions when not
        0 .. S-1 (randomised positions, in training)."""
        side = self.source(src, src_lengths, positions)
        out = self.encoder.encode(side, need_weights)
        return EncoderOutput(out.x, side.layout.mask, out.weights if need_weights else None,
                             side.mask if side.layout.packed else None, out.ponder, side.layout)

    def decode(self, tgt_in: Tensor, tgt_lengths: Tensor, enc: EncoderOutput, need_weights: bool = False,
               positions: Tensor | None = None) -> ModelOutput:
        """tgt_in (B, T) = BOS + target, all positions at once -> hidden (B, T, D), or (1, Nt, D) packed."""
        if self.packed and not enc.packed:
            raise ValueError("the packed (graph) decoder needs a packed encoder output; encode with "
                             "model.attention=graph too")
        side = self.target(tgt_in, tgt_lengths, positions)
        memory_layout = enc.layout if enc.layout is not None else Padded(enc.mask.sum(1), enc.mask.shape[1])
        cross_mask = side.layout.cross_mask(memory_layout)
        out = self.decoder.decode(side, enc.memory, cross_mask, need_weights)
        att = None
        if need_weights:
            att = Attentions(encoder=enc.attentions or [], decoder=out.self_weights, cross=out.cross_weights)
            if side.layout.packed:
                att.graphs.update(encoder=enc.graph, decoder=side.mask, cross=cross_mask)
        ponder = None if out.ponder is None else (enc.ponder, out.ponder)
        return ModelOutput(out.x, side.layout.mask, att, side.layout.packed, ponder)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
                need_weights: bool = False, positions: RandomPositions | None = None) -> ModelOutput:
        """`positions`: randomised positions (train.random_positions), one draw for the batch that both sides
        share (source and target slot i at the same position, as at inference)."""
        index = None if positions is None else positions(max(src.shape[1], tgt_in.shape[1]), src.device)
        enc = self.encode(src, src_lengths, need_weights, index)
        return self.decode(tgt_in, tgt_lengths, enc, need_weights, index)._replace(encoder=enc)

    # ------------------------------------------------------------------ decoder, one step at a time

    def init_cache(self, enc: EncoderOutput) -> DecoderCache:
        """Everything a decoding step needs, batch first, so a search can reorder it. A packed memory is laid
        out per sentence (B, S, D) here: the graph of each step skips the padding."""
        memory = enc.memory if enc.layout is None else enc.layout.padded(enc.memory)  # (B, S, D)
        return self.decoder.init_cache(memory, enc.mask)

    def decode_step(self, tokens: Tensor, cache: DecoderCache, output: Projection | None = None
                    ) -> tuple[Tensor, DecoderCache]:
        """tokens (N,) at the next position -> logits (N, V) and the cache with this position added; with
        `output` (`restricted_output`), the logits of its K rows only (N, K).

        The cache's source mask and cross-attention keys/values have one row per sentence (B); the
        self-attention entries one row per hypothesis, N = B x K with a sentence's K hypotheses in consecutive
        rows: they all read their sentence's memory, which is never copied per beam."""
        t = cache.t  # positions decoded so far
        layout = Step(tokens.shape[0], t, cache.src_mask, self.decoder_structure, self.packed, cache.full_sources)
        e = self.tgt_embed(tokens[:, None], layout.positions())  # (N, 1, D)
        table = None if self.tgt_bias is None else self.tgt_bias(1, t + 1, t)  # (H, 1, t+1): the row of position t
        side = Side(e.x, e.positions, layout, None, layout.bias(table), self._rotary("decoder", layout.positions(),
                                                                                    e.x.device))
        x, cache = self.decoder.step(side, cache)
        return (self.generator if output is None else output)(x[:, 0]), cache  # (N, V) or (N, K)

    def restricted_output(self, ids: Tensor) -> Projection:
        """The output projection of the target ids `ids` (K,) only, for decode_step (a lexical shortlist)."""
        return restricted_linear(self.generator, ids)


_RENAMES = (  # checkpoints written before the model was a composition (format 1, tformer <= 0.2)
    (r"^(encoder|decoder)_layers\.0\.", r"\1.layer."),  # universal: the one shared layer
    (r"^(encoder|decoder)_layers\.", r"\1.layers."),
    (r"^(encoder|decoder)_norm\.", r"\1.norm."),
    (r"^(encoder|decoder)_halt\.", r"\1.halt."),
)


def upgrade_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Tensor names of an older checkpoint in today's names (unchanged when already current)."""
    universal = any(k.startswith("encoder_halt.") for k in tensors)
    out = {}
    for name, value in tensors.items():
        for pattern, repl in _RENAMES[0 if universal else 1:]:
            name, n = re.subn(pattern, repl, name)
            if n:
                break
        out[name] = value
    return out


_LEGACY_ORDER = ("encoder.layer", "decoder.layer", "encoder.norm.", "decoder.norm.", "generator.", "encoder.halt.",
                 "decoder.halt.")


def legacy_parameter_order(model: nn.Module) -> list[int]:
    """Index (in today's `model.parameters()` order) of each parameter in the order an older checkpoint's
    optimizer state lists them: the modules were registered as embeddings, biases, encoder layers, decoder
    layers, norms, generator, halting units."""
    names = [n for n, _ in model.named_parameters()]

    def group(name: str) -> int:
        return next((i + 1 for i, prefix in enumerate(_LEGACY_ORDER) if name.startswith(prefix)), 0)

    return sorted(range(len(names)), key=lambda i: group(names[i]))


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> Transformer:
    return Transformer(cfg, src_vocab, tgt_vocab)
