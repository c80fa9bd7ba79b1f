"""How much a decoding step could gain from a fixed-capacity cache: tformer's eager step beside a lean functional
step of the same weights (keys and values written into preallocated (capacity) tensors at a position held in a
tensor, the self-attention masked over the capacity, the source padded to a bucket), eager and under
torch.compile: whole (inductor's own products), and the glue alone around tformer's products, which the compiler
sees as opaque custom ops (`opaque`), with or without inductor's cpp_wrapper (`--cpp-wrapper`). A measurement for
issues 45 and 64 ("cut Python work per step", "compile what wins"), before building any of it into the library.

    python benchmarks/studies/static_step.py [--folder FOLDER | --opus-base] [--batch-size 1 32] [--steps 24] [--rounds 3]
                                     [--cpp-wrapper]

Post-norm Marian-shaped models only (the OPUS-MT-base shape of benchmarks/decoding_peers.py): the functional
step is written for that architecture. Its logits are checked against tformer's `decode_step` at every step
of the first sentence batch (max abs difference printed), then each variant decodes `--steps` greedy steps
from the same encoder output, rounds taking turns; the table gives ms per step (median) and the compile time
(first call, the shapes of every later call being the same: nothing recompiles).
"""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA  # noqa: E402
from decoding_peers import opus_base_folder  # noqa: E402

import tformer  # noqa: E402


def weights(model, products: bool = False) -> dict:
    """The decoder's tensors, by layer, as plain tensors; with `products`, also each product as the model runs
    it ("fn": its prepacked layers, on the matrix library tformer measured fastest per shape)."""
    layers = []
    for layer in model.decoder.layers:
        sd = {k: v.detach() for k, v in layer.state_dict().items()}
        if products:
            sd["fn"] = {"self_attn.in_proj": layer.self_attn.in_proj, "self_attn.out_proj": layer.self_attn.out_proj,
                        "cross_attn.q": layer.cross_attn.prepacked["q"],
                        "cross_attn.out_proj": layer.cross_attn.out_proj, "ffn.linear1": layer.ffn.linear1,
                        "ffn.linear2": layer.ffn.linear2}
        layers.append(sd)
    return dict(layers=layers, embed=model.tgt_embed.tokens.weight.detach(), scale=model.tgt_embed.scale,
                table=model.tgt_embed.positions.table.detach(), gen_bias=model.generator.bias.detach(),
                heads=model.cfg.n_heads, eps=model.cfg.layer_norm_eps, generator=model.generator if products else None)


_OPAQUE: list = []  # products the compiler sees as one opaque call each (`opaque`), by index


@torch.library.custom_op("tformer_bench::product", mutates_args=())
def _product(x: torch.Tensor, index: int) -> torch.Tensor:
    return _OPAQUE[index](x)


@_product.register_fake
def _(x, index):
    return x.new_empty(*x.shape[:-1], _OPAQUE[index].weight.shape[0])


def opaque(w: dict) -> dict:
    """w (with products) whose products are opaque custom ops: torch.compile fuses the glue around them and
    calls tformer's own products (its measured matrix library) unchanged."""
    def wrap(fn):
        _OPAQUE.append(fn)
        index = len(_OPAQUE) - 1
        return lambda x: _product(x, index)

    layers = [dict(p, fn={k: wrap(f) for k, f in p["fn"].items()}) for p in w["layers"]]
    return dict(w, layers=layers, generator=wrap(w["generator"]))


def _linear(p: dict, name: str, x, rows: slice | None = None):
    if "fn" in p:
        return p["fn"]["cross_attn.q" if rows is not None else name](x)
    weight, bias = p[name + ".weight"], p[name + ".bias"]
    return F.linear(x, weight if rows is None else weight[rows], bias if rows is None else bias[rows])


def lean_step(w: dict, tok, pos, keys, values, cross, src_mask):
    """tok (N,), pos () long, keys/values [L] of (N, H, C, Dh) written in place at pos, cross [L] of (k, v)
    (N, H, S, Dh), src_mask (N, 1, 1, S) bool -> logits (N, V)."""
    H = w["heads"]
    x = w["embed"][tok] * w["scale"] + w["table"].index_select(0, pos.view(1))  # (N, D)
    N, D = x.shape
    Dh = D // H
    capacity = keys[0].shape[2]
    self_mask = (torch.arange(capacity, device=x.device) <= pos)[None, None, None, :]  # (1, 1, 1, C)
    for i, p in enumerate(w["layers"]):
        qkv = _linear(p, "self_attn.in_proj", x).view(N, 3, H, 1, Dh)
        keys[i].index_copy_(2, pos.view(1), qkv[:, 1])
        values[i].index_copy_(2, pos.view(1), qkv[:, 2])
        a = F.scaled_dot_product_attention(qkv[:, 0], keys[i], values[i], attn_mask=self_mask)  # (N, H, 1, Dh)
        a = _linear(p, "self_attn.out_proj", a.reshape(N, D))
        x = F.layer_norm(x + a, (D,), p["res_self.norm.weight"], p["res_self.norm.bias"], w["eps"])
        q = _linear(p, "cross_attn.in_proj", x, slice(0, D)).view(N, H, 1, Dh)
        a = F.scaled_dot_product_attention(q, cross[i][0], cross[i][1], attn_mask=src_mask)
        a = _linear(p, "cross_attn.out_proj", a.reshape(N, D))
        x = F.layer_norm(x + a, (D,), p["res_cross.norm.weight"], p["res_cross.norm.bias"], w["eps"])
        h = _linear(p, "ffn.linear2", F.silu(_linear(p, "ffn.linear1", x)))
        x = F.layer_norm(x + h, (D,), p["res_ffn.norm.weight"], p["res_ffn.norm.bias"], w["eps"])
    return w["generator"](x) if w["generator"] is not None else F.linear(x, w["embed"], w["gen_bias"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="a Hugging Face MarianMT folder (post-norm, silu)")
    ap.add_argument("--opus-base", action="store_true")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--bucket", type=int, default=16, help="sources padded to a multiple of this")
    ap.add_argument("--cpp-wrapper", action="store_true", help="inductor's cpp_wrapper: the compiled step calls its "
                    "kernels from C++ instead of Python")
    args = ap.parse_args()
    folder = opus_base_folder(Path(tempfile.mkdtemp()) / "opus-base") if args.opus_base else Path(args.folder)
    translator = tformer.load(folder, device="cpu")
    model = translator.model
    import tformer.model.matmul as matmul  # the same weights, not prepacked: what inductor can take

    available = matmul.available
    matmul.available = lambda: False
    plain = tformer.load(folder, device="cpu")
    matmul.available = available
    w = weights(plain.model)
    w_packed = weights(model, products=True)
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sources = [translator.encode(line.strip()) + [2] for line in f][:64]
    threads = torch.get_num_threads()
    print(f"{threads} threads, capacity {args.capacity}, sources padded to a multiple of {args.bucket}")
    print("| batch | step | ms per step | compile (s) |\n|---:|---|---:|---:|")
    import torch._inductor.config as inductor

    inductor.freezing = True
    inductor.cpp_wrapper = args.cpp_wrapper
    compiled = torch.compile(lean_step, dynamic=False)
    w_opaque = opaque(w_packed)
    glue = torch.compile(lean_step, dynamic=False, fullgraph=True)
    for B in args.batch_size:
        batch = sources[:B]
        S = math.ceil(max(map(len, batch)) / args.bucket) * args.bucket
        src = torch.zeros(B, S, dtype=torch.long)
        for i, s in enumerate(batch):
            src[i, : len(s)] = torch.tensor(s)
        lengths = torch.tensor([len(s) for s in batch])
        with torch.inference_mode():
            enc = model.encode(src, lengths)
            cache0 = model.init_cache(enc)
            cross = [tuple(t.contiguous() for t in kv) for kv in cache0.cross]
            src_mask = (torch.arange(S)[None] < lengths[:, None])[:, None, None, :]
            H, Dh = model.cfg.n_heads, model.cfg.d_model // model.cfg.n_heads

            def run_eager_tformer():
                cache, tok = model.init_cache(enc), torch.full((B,), 1)
                for _ in range(args.steps):
                    logits, cache = model.decode_step(tok, cache)
                    tok = logits.argmax(-1)
                return tok

            def run_lean(fn):
                keys = [torch.zeros(B, H, args.capacity, Dh) for _ in w["layers"]]
                values = [torch.zeros(B, H, args.capacity, Dh) for _ in w["layers"]]
                tok = torch.full((B,), 1)
                for t in range(args.steps):
                    tok = fn(w, tok, torch.tensor(t), keys, values, cross, src_mask).argmax(-1)
                return tok

            # fidelity: the lean step's logits against tformer's, step by step, greedy from <s>
            keys = [torch.zeros(B, H, args.capacity, Dh) for _ in w["layers"]]
            values = [torch.zeros(B, H, args.capacity, Dh) for _ in w["layers"]]
            cache, tok, worst = model.init_cache(enc), torch.full((B,), 1), 0.0
            for t in range(args.steps):
                want, cache = model.decode_step(tok, cache)
                got = lean_step(w, tok, torch.tensor(t), keys, values, cross, src_mask)
                worst = max(worst, float((got - want).abs().max()))
                tok = want.argmax(-1)
            tic = time.perf_counter()
            run_lean(compiled)
            compile_s = time.perf_counter() - tic
            tic = time.perf_counter()
            run_lean(lambda _, *a: glue(w_opaque, *a))
            glue_s = time.perf_counter() - tic
            compile_times = {"lean compiled": compile_s, "lean compiled glue, tformer's products": glue_s}
            variants = {"tformer eager": run_eager_tformer, "lean eager": lambda: run_lean(lean_step),
                        "lean eager, tformer's products": lambda: run_lean(lambda _, *a: lean_step(w_packed, *a)),
                        "lean compiled": lambda: run_lean(compiled),
                        "lean compiled glue, tformer's products": lambda: run_lean(lambda _, *a: glue(w_opaque, *a))}
            times = {k: [] for k in variants}
            for r in range(args.rounds):
                for name in list(variants)[r % len(variants):] + list(variants)[: r % len(variants)]:
                    tic = time.perf_counter()
                    variants[name]()
                    times[name].append((time.perf_counter() - tic) / args.steps * 1000)
        for name in variants:
            print(f"| {B} | {name} | {statistics.median(times[name]):.2f} | "
                  f"{f'{compile_times[name]:.0f}' if name in compile_times else ''} |")
        print(f"(batch {B}: lean step's logits within {worst:.2e} of tformer's)")


if __name__ == "__main__":
    main()
