"""What the layout of the cached cross-attention keys and values costs a decoding step: held contiguous (what
the decoder's cache holds, `MultiHeadAttention.memory_kv`) against the strided views of one projection that
`project_kv` returns (what it held before), in one process, taking turns round after round (the machine is
shared and noisy). Two parts:

1. the attention kernels alone, on one step's shapes (1 query per row, or a sentence's K beams folded into K
   queries) with the keys and values strided or contiguous: microseconds per call;
2. whole searches through the public API (`Translator.translate`) on Multi30k test2016 sentences, with the
   cache as the library builds it or with the strided views put back: ms per batch, the ratio, and whether
   the outputs are equal (they must be: the same values, laid out differently).

    python benchmarks/studies/cross_kv_layout.py [--folder FOLDER | --opus-base] [--batch-size 1 32] [--beams 1 4]
                                         [--max-len 24] [--rounds 5] [--quantize int8] [--record]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: common.py, shared scripts
from common import SHARED_DATA, report  # noqa: E402
from decoding_peers import opus_base_folder  # noqa: E402

import tformer  # noqa: E402
from tformer.attention.kernels import dense_attention, sdpa_attention  # noqa: E402
from tformer.model.cache import DecoderCache  # noqa: E402
from tformer.model.stack import LayerStack  # noqa: E402


def _micros(fn, calls: int = 50) -> float:
    fn()
    times = []
    for _ in range(calls):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times) * 1e6


def kernels(heads: int, head_dim: int) -> list[str]:
    """The attention kernels on one step's shapes: keys and values strided (views of a (B, S, 2 H Dh)
    projection) or contiguous."""
    rows = ["| queries per sentence | sentences | keys | kernel | strided (us) | contiguous (us) | ratio |",
            "|---:|---:|---:|---|---:|---:|---:|"]
    g = torch.Generator().manual_seed(0)
    for T, B, S in [(1, 1, 16), (1, 32, 24), (4, 1, 16), (4, 32, 24), (5, 64, 24)]:
        q = torch.randn(B, T, heads, head_dim, generator=g).transpose(1, 2)  # (B, H, T, Dh)
        kv = torch.randn(B, S, 2 * heads * head_dim, generator=g)
        k, v = (t.view(B, S, heads, head_dim).transpose(1, 2) for t in kv.chunk(2, dim=-1))  # (B, H, S, Dh) views
        lengths = torch.randint(S // 2, S + 1, (B,), generator=g)
        mask = (torch.arange(S)[None] < lengths[:, None])[:, None, None, :]
        for name, kernel in (("dense", dense_attention), ("sdpa", sdpa_attention)):
            with torch.inference_mode():
                strided = _micros(lambda: kernel(q, k, v, mask))
                kc, vc = k.contiguous(), v.contiguous()
                contiguous = _micros(lambda: kernel(q, kc, vc, mask))
            rows.append(f"| {T} | {B} | {S} | {name} | {strided:.0f} | {contiguous:.0f} | "
                        f"{strided / contiguous:.2f}x |")
    return rows


def strided_init_cache(self: LayerStack, memory: torch.Tensor, src_mask: torch.Tensor) -> DecoderCache:
    """The cache as it was: `project_kv`'s strided views."""
    return DecoderCache(src_mask, [layer.cross_attn.project_kv(memory) for layer in self.layers])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="a Hugging Face MarianMT folder or a tformer run")
    ap.add_argument("--opus-base", action="store_true", help="build the random OPUS-MT-base-shaped folder")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quantize", choices=["none", "int8"], default="none", help="the model's linear layers")
    ap.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    args = ap.parse_args()
    folder = opus_base_folder(Path(tempfile.mkdtemp()) / "opus-base") if args.opus_base else Path(args.folder)
    translator = tformer.load(folder, device="cpu", quantize=args.quantize)
    cfg = translator.model.cfg
    table = kernels(cfg.n_heads, cfg.d_model // cfg.n_heads)
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f]
    table += ["", "| decoding | batch | strided (ms) | contiguous (ms) | contiguous vs strided | outputs equal |",
              "|---|---:|---:|---:|---:|---|"]
    built = LayerStack.init_cache
    for B in args.batch_size:
        for beam in args.beams:
            batch = sentences[:B]
            times: dict[str, list[float]] = {"strided": [], "contiguous": []}
            outputs = {}
            for r in range(args.rounds + 1):  # round 0 warms up, untimed
                for layout in (("strided", "contiguous") if r % 2 else ("contiguous", "strided")):
                    LayerStack.init_cache = strided_init_cache if layout == "strided" else built
                    tic = time.perf_counter()
                    outputs[layout] = translator.translate(batch, beam=beam, len_penalty=0.0, max_len_a=0.0,
                                                           max_len_b=args.max_len, batch_size=B)
                    if r:
                        times[layout].append(time.perf_counter() - tic)
            LayerStack.init_cache = built
            s, c = (statistics.median(times[k]) * 1000 for k in ("strided", "contiguous"))
            table.append(f"| {'greedy' if beam == 1 else f'beam {beam}'} | {B} | {s:.0f} | {c:.0f} | {s / c:.2f}x | "
                         f"{outputs['strided'] == outputs['contiguous']} |")
    notes = (f"{folder.name} ({'int8' if args.quantize == 'int8' else 'fp32'}): d={cfg.d_model}, {cfg.n_heads} heads; Multi30k test2016 sentences, output limit "
             f"{args.max_len}, median of {args.rounds} rounds taking turns, {torch.get_num_threads()} threads")
    report("The cached cross-attention keys and values: strided views or contiguous", table, notes, args.record)


if __name__ == "__main__":
    main()
