"""Decoding speed beside the peers, in one run: tformer through its public API (`Translator.translate`: raw
sentences in, detokenised text out), fp32 and dynamic int8 (decode.quantize=int8), and with beam search also
under fairseq's rule for endings (beam_finish=top_k, what CTranslate2 does); tformer's internal id path
(`translate_ids`, what the API calls: the difference is the API's own cost), CTranslate2 (fp32, int8) on the
export, Hugging Face MarianMT `generate` with our weights copied in. Multi30k test2016 sources, batch 64, greedy and beam 5. The API engine tokenises
and detokenises inside the timing; the others are given token ids or pieces.

    python benchmarks/decoding_peers.py --checkpoint runs/multi30k_en_de [--random] [--rounds 3] [--record]
    python benchmarks/decoding_peers.py --folder FOLDER | --opus-base [--batch-size 1 8 32 64] [--profile] [--memory]

--checkpoint: the trained model (pre-norm, so MarianMT, post-norm only, sits out); translations are also
compared with tformer's, sentence by sentence, and scored with sacreBLEU.
--random: a random post-norm Marian-size model (d=256, 3+3 layers, 4 heads, FFN 1024, the checkpoint's
vocabulary) that every peer can run; random weights decode to the length limit, so this measures the
machinery on long outputs. Each (engine, setting) runs `--rounds` times over the same length-sorted batches,
the engines taking turns batch by batch (the machine is shared and noisy), in an order that rotates from batch
to batch (an engine that always ran right after another would find that one's weights, or its own, in cache);
the table gives the median. Target tokens = generated tokens with </s>.
--folder: a Hugging Face MarianMT folder (an OPUS-MT model): tformer loads the folder itself (imported in
memory), CTranslate2 converts it with its own converter (TransformersConverter, fp32 and int8) and Hugging Face
runs MarianMTModel.from_pretrained on it. --opus-base builds such a folder first: OPUS-MT's base shape (d=512,
6+6 layers, 8 heads, FFN 2048, swish, one shared table of 58,101 entries: SentencePiece models of 6,000 pieces
per side trained on Multi30k, the rest of the table entries no text produces), random weights (random
outputs run to the length limit, so every engine decodes the same number of tokens). --profile adds the share
of tformer's decoding time spent outside the matrix products (torch.profiler, the id path, first batches). The fp32
matrix-multiply ceiling is measured in the same run (torch.mm, 1024^3) and the decoder's FLOPs per target
token (projections, FFN, generator and attention over the cache, counted per hypothesis) give each engine's
decoder GFLOP/s and the fraction of the ceiling it reaches (the same count for every engine: the arithmetic
a generated token needs, whatever an engine actually runs); tformer-bf16 (tformer.load(..., precision="bf16"))
is set against the bf16 ceiling, measured the same way, and against CTranslate2 fp32 (its best float on a CPU);
tformer-compiled is tformer.load(..., compile=True), its decoding step compiled ahead of time (tformer.model.compiled;
compiled, or read from $TFORMER_CACHE, at load, untimed).
"ms per call": the median time of one call on one batch (at batch 1: a sentence's latency). --memory: each
engine's peak resident memory, in a fresh process of its own that loads only that engine (imports of torch and
ctranslate2 included, measured alone as the baseline row) and decodes the first four batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ct2_worker import CT2Worker  # noqa: E402
from common import SHARED_DATA, append_results, gemm_ceiling  # noqa: E402

import tformer  # noqa: E402
from tformer.config import DecodeConfig  # noqa: E402
from tformer.export import export_ctranslate2, to_hf_marian  # noqa: E402
from tformer.inference import translate_ids  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402
from tformer.model import build_model  # noqa: E402


def decoder_flops_per_token(cfg, vocab: int, src_len: float, tgt_len: float) -> float:
    """Multiply-adds x 2 per generated token and hypothesis: self-attention projections (4 D^2), cross
    query and output (2 D^2), FFN (2 D F), scores and values over the cache (2 D t, t = mean position) and
    the source (2 D S), generator (D V)."""
    D, F, L = cfg.d_model, cfg.d_ff, cfg.decoder_layers
    per_layer = 4 * D * D + 2 * D * D + 2 * D * F + 2 * D * (tgt_len / 2) + 2 * D * src_len
    return 2 * (L * per_layer + D * vocab)


def opus_base_folder(out: Path) -> Path:
    """A random OPUS-MT-base-shaped Hugging Face folder (see --opus-base), built with the tests' builder."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.hf_marian_models import make_folder

    return make_folder(out, seed=0, d_model=512, layers=6, heads=8, ffn=2048, src_size=6000, tgt_size=6000,
                       vocab_size=58101, n_sentences=29000, init_std=0.02, eos_bias=0.0, drop_piece=None)


MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "quantized::linear_dynamic",
                   "mkldnn::_linear_pointwise")  # the last: the prepacked products (tformer.model.matmul)


def outside_matrix_products(fn) -> tuple[float, float]:
    """(share of fn's wall time outside matrix-product kernels, of which in SDPA attention kernels), by
    torch.profiler's self CPU times (the kernels run on the calling thread's clock)."""
    from torch.profiler import ProfilerActivity, profile

    tic = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    wall = time.perf_counter() - tic
    stats = prof.key_averages()
    mm = sum(e.self_cpu_time_total for e in stats if e.key in MATRIX_PRODUCTS) / 1e6
    sdpa = sum(e.self_cpu_time_total for e in stats if "scaled_dot_product" in e.key) / 1e6
    return 1 - mm / wall, sdpa / wall


def rss_child(spec: dict) -> None:
    """--rss-child: load one engine alone, decode the given batches, print the process's peak RSS in MiB (and
    the peak before loading: the imports)."""
    import ctranslate2  # noqa: F401 (imported by every child alike: the baseline counts it)

    torch.set_num_threads(spec["threads"])
    before = _rss()["VmRSS"]
    engine, beam, n = spec["engine"], spec["beam"], spec["max_len"]
    if engine.startswith("ct2"):
        t = ctranslate2.Translator(spec["ct2_dir"], device="cpu", intra_threads=spec["threads"], inter_threads=1)
        for chunk in spec["pieces"]:
            t.translate_batch(chunk, beam_size=beam, length_penalty=0.0, max_decoding_length=n, min_decoding_length=0)
    elif engine != "none":
        kw = dict(quantize="int8") if engine.endswith("int8") else dict(precision="bf16") if engine.endswith(
            "bf16") else dict(compile=True) if engine.endswith("compiled") else {}
        t = tformer.load(spec["source"], device="cpu", **kw)
        for chunk in spec["sentences"]:
            t.translate(chunk, beam=beam, len_penalty=0.0, max_len_a=0.0, max_len_b=n, batch_size=len(chunk))
    print(json.dumps({**_rss(), "imports": before}))


def _rss() -> dict[str, float]:
    """This process's resident memory now (VmRSS) and at its peak (VmHWM), MiB, from /proc/self/status."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--rss-child":
        return rss_child(json.loads(Path(sys.argv[2]).read_text()))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--folder", help="a Hugging Face MarianMT folder instead of a tformer checkpoint")
    ap.add_argument("--opus-base", action="store_true", help="build a random OPUS-MT-base-shaped folder and use it")
    ap.add_argument("--profile", action="store_true", help="also measure tformer's time outside matrix products")
    ap.add_argument("--memory", action="store_true", help="also each engine's peak RSS, in a process of its own")
    ap.add_argument("--random", action="store_true", help="a random post-norm Marian-size model instead")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[64])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--rounds", type=int, default=3, help="0: no timing (with --memory: the memory table alone)")
    ap.add_argument("--max-len", type=int, default=0, help="output limit in tokens (default 64 random, 128 trained)")
    ap.add_argument("--engines", nargs="+", default=["tformer", "tformer-top_k", "tformer-ids", "tformer-int8",
                                                         "ct2-fp32", "ct2-int8", "hf"])
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    work = Path(tempfile.mkdtemp(prefix="tformer-peers-"))
    folder = opus_base_folder(work / "opus-base") if args.opus_base else Path(args.folder) if args.folder else None
    source_ckpt = folder or Path(args.checkpoint)

    translator = tformer.load(source_ckpt, device="cpu")
    int8 = tformer.load(source_ckpt, device="cpu", quantize="int8")
    bf16 = tformer.load(source_ckpt, device="cpu", precision="bf16") if "tformer-bf16" in args.engines else None
    compiled = tformer.load(source_ckpt, device="cpu", compile=True) if "tformer-compiled" in args.engines else None
    ckpt, model = translator.checkpoint, translator.model
    src_tok, tgt_tok = ckpt.tokenizers
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.en.gz", "rt", encoding="utf-8") as f:
        sources = [line.strip() for line in f][: args.sentences]
    with gzip.open(SHARED_DATA / "multi30k" / "test2016.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f][: args.sentences]
    ids = [translator.encode(s) for s in sources]
    engines = args.engines
    if args.random:
        torch.manual_seed(0)
        cfg = dataclasses.replace(ckpt.cfg.model, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3,
                                  decoder_layers=3, norm="post", dropout=0.0, attention_dropout=0.0, ffn_dropout=0.0)
        model = build_model(cfg, len(src_tok.vocab), len(tgt_tok.vocab)).eval()
        max_len = 64  # random weights run to the limit
    elif folder is not None:
        cfg = ckpt.cfg.model
        max_len = 64 if args.opus_base else 128
    else:
        cfg = ckpt.cfg.model
        engines = [e for e in args.engines if e != "hf" or cfg.norm == "post"]
        max_len = 128
    max_len = args.max_len or max_len
    if args.random:  # the random model as a checkpoint folder: the API and the export load it from there
        from tformer.checkpoint import save_checkpoint

        save_checkpoint(work / "run", 0, model, None, {}, dataclasses.replace(ckpt.cfg, model=cfg), ckpt.tokenizers,
                        best=True)
        source_ckpt = work / "run"
        translator = tformer.load(source_ckpt, device="cpu")
        int8 = tformer.load(source_ckpt, device="cpu", quantize="int8")
        bf16 = tformer.load(source_ckpt, device="cpu", precision="bf16") if bf16 is not None else None
        compiled = tformer.load(source_ckpt, device="cpu", compile=True) if compiled is not None else None
    ct2_dirs = {}
    if any(e.startswith("ct2") for e in engines):
        import ctranslate2

        for name, quantization in (("ct2-fp32", None), ("ct2-int8", "int8")):
            if folder is not None:  # CTranslate2's own converter, from the same folder
                from ctranslate2.converters import TransformersConverter

                ct2_dirs[name] = TransformersConverter(str(folder)).convert(str(work / name),
                                                                            quantization=quantization)
            else:
                ct2_dirs[name] = export_ctranslate2(source_ckpt, work / name, quantization=quantization)
        # each model in a process of its own: in one process, CTranslate2 and PyTorch, or two Translators, slow
        # each other down (ct2_worker.py)
        ct2 = {k: CT2Worker(str(v), threads) for k, v in ct2_dirs.items()}
    if "hf" in engines and folder is not None:
        from transformers import MarianMTModel

        hf = MarianMTModel.from_pretrained(folder).eval()
        src_out = src_tok.original  # tformer id -> the folder's id
        tgt_in = {m: i for i, m in enumerate(tgt_tok.original)}
        hf_eos, hf_pad = hf.config.eos_token_id, hf.config.pad_token_id
        suppress = [hf_pad]
    elif "hf" in engines:
        hf = to_hf_marian(model)
        src_out, tgt_in, hf_eos, hf_pad, suppress = None, None, 2, 0, [0, 1]
    pieces = [translator.pieces(x, "source") for x in ids]
    stoi = tgt_tok.vocab.stoi
    skip = {"<pad>"}  # never a translation token

    def run(engine: str, beam: int, chunk: list[int], batch_size: int) -> tuple[list[list[int]], float | None]:
        """The hypotheses, and the seconds the engine's worker process timed (None: timed here)."""
        if engine.startswith("ct2"):
            hyps, seconds = ct2[engine].translate([pieces[i] for i in chunk], beam, max_len, batch_size)
            return [[stoi.get(t, 3) for t in h if t not in skip] for h in hyps], seconds
        return run_here(engine, beam, chunk, batch_size), None

    def run_here(engine: str, beam: int, chunk: list[int], batch_size: int) -> list[list[int]]:
        if engine in ("tformer", "tformer-top_k", "tformer-int8", "tformer-bf16", "tformer-compiled"):  # the API
            rule = dict(beam_finish="top_k") if engine == "tformer-top_k" else {}
            loaded = {"tformer-int8": int8, "tformer-bf16": bf16, "tformer-compiled": compiled}.get(engine, translator)
            out = loaded.translate(
                [sources[i] for i in chunk], beam=beam, len_penalty=0.0, max_len_a=0.0, max_len_b=max_len,
                batch_size=batch_size, **rule)
            return [[stoi.get(p, 3) for p in t.tokens] for t in out]
        if engine == "tformer-ids":  # the id path the API calls
            decode = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                                  max_len_a=0.0, max_len_b=max_len, batch_size=batch_size)
            return [h[0] for h in translate_ids(translator.model, [ids[i] for i in chunk], decode).tokens]
        # hf: batches in length order, as the others do
        order = sorted(range(len(chunk)), key=lambda j: -len(ids[chunk[j]]))
        result: dict[int, list[int]] = {}
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            inp = torch.nn.utils.rnn.pad_sequence(
                [torch.tensor([src_out[t] for t in ids[chunk[j]]] + [hf_eos] if src_out else ids[chunk[j]] + [2])
                 for j in rows], batch_first=True, padding_value=hf_pad)
            extra = dict(length_penalty=0.0) if beam > 1 else {}
            with torch.inference_mode():
                gen = hf.generate(input_ids=inp, attention_mask=inp != hf_pad, num_beams=beam, max_new_tokens=max_len,
                                  do_sample=False, suppress_tokens=suppress, forced_eos_token_id=None, **extra)
            for i, row in zip(rows, gen.tolist()):
                row = row[1:]
                row = [t for t in (row[: row.index(hf_eos)] if hf_eos in row else row) if t != hf_pad]
                result[i] = [tgt_in[t] for t in row] if tgt_in else row
        return [result[j] for j in range(len(chunk))]

    def runs(engine: str, beam: int) -> bool:  # the fairseq-rule variant differs from tformer's only in beam search
        return engine != "tformer-top_k" or beam > 1

    ceiling, ceiling_bf16 = gemm_ceiling(), gemm_ceiling(dtype=torch.bfloat16)
    vocab = len(tgt_tok.vocab)
    src_len = statistics.mean(len(x) + 1 for x in ids)
    table = ["| decoding | batch | engine | sentences/s | target tokens/s | ms per call | vs tformer | vs ct2 of its "
             "precision | decoder GFLOP/s (% of ceiling) | equal to tformer | BLEU |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    rows: list[tuple[str, float, str]] = []  # formatted once the ceiling's last measurement is in
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for batch_size in args.batch_size if args.rounds else []:  # --rounds 0: memory alone (--memory)
        for engine in engines:  # warm-up: first calls pay for lazy initialisation
            for beam in args.beams:
                if runs(engine, beam):
                    run(engine, beam, order[:batch_size], batch_size)
        # every engine gets the same batches: the sentences sorted by length, cut into batch-size chunks, which
        # the engines translate in turns, chunk by chunk (the shared machine's load changes by the second)
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        times: dict[tuple[str, int], list[float]] = {}
        calls: dict[tuple[str, int], list[float]] = {}  # every call's time, every round
        outputs: dict[tuple[str, int], list[list[int]]] = {}
        for _ in range(args.rounds):
            for beam in args.beams:
                spent = {engine: 0.0 for engine in engines}
                for engine in engines:
                    outputs[engine, beam] = [[] for _ in ids]
                for c, chunk in enumerate(chunks):  # the order rotates: no engine always runs after another's
                    for engine in engines[c % len(engines):] + engines[: c % len(engines)]:  # weights left in cache
                        if not runs(engine, beam):
                            continue
                        tic = time.perf_counter()
                        out, seconds = run(engine, beam, chunk, batch_size)
                        seconds = time.perf_counter() - tic if seconds is None else seconds
                        spent[engine] += seconds
                        calls.setdefault((engine, beam), []).append(seconds)
                        for i, hyp in zip(chunk, out):
                            outputs[engine, beam][i] = hyp
                for engine in engines:
                    if runs(engine, beam):
                        times.setdefault((engine, beam), []).append(spent[engine])
        for beam in args.beams:
            base = statistics.median(times["tformer", beam]) if ("tformer", beam) in times else None
            for engine in engines:
                if not runs(engine, beam):
                    continue
                secs = statistics.median(times[engine, beam])
                peer = "ct2-int8" if engine.endswith("int8") else "ct2-fp32"
                peer_secs = statistics.median(times[peer, beam]) if (peer, beam) in times else float("nan")
                out = outputs[engine, beam]
                n_tok = sum(len(h) + 1 for h in out)
                same = sum(a == b for a, b in zip(out, outputs.get(("tformer", beam), out)))
                bleu = translation_scores([tgt_tok.decode(h) for h in out], refs, "de").bleu
                flops = decoder_flops_per_token(cfg, vocab, src_len, n_tok / len(out)) * n_tok * beam / secs / 1e9
                rows.append((f"| {'greedy' if beam == 1 else f'beam {beam}'} | {batch_size} | {engine} | "
                             f"{len(out) / secs:.1f} | {n_tok / secs:,.0f} | "
                             f"{1000 * statistics.median(calls[engine, beam]):.1f} | "
                             f"{base / secs if base else float('nan'):.2f}x | {peer_secs / secs:.2f}x | ", flops,
                             f" | {same}/{len(out)} | {bleu:.2f} |", engine.endswith("bf16")))
        if args.profile:
            for beam in args.beams:
                for name, t in (("fp32", translator), ("int8", int8)):
                    cfg_p = DecodeConfig(strategy="greedy" if beam == 1 else "beam", beam_size=beam, len_penalty=0.0,
                                         max_len_a=0.0, max_len_b=max_len, batch_size=batch_size)
                    outside, sdpa = outside_matrix_products(
                        lambda: translate_ids(t.model, [ids[i] for i in order[: 4 * batch_size]], cfg_p))
                    notes.append(f"tformer {name}, {'greedy' if beam == 1 else f'beam {beam}'}, batch {batch_size}: "
                                 f"{100 * outside:.0f}% of the decoding time outside matrix products (of which "
                                 f"{100 * sdpa:.0f}% in the attention kernel)")
    ceiling, ceiling_bf16 = max(ceiling, gemm_ceiling()), max(ceiling_bf16, gemm_ceiling(dtype=torch.bfloat16))
    table += [f"{head}{flops:.1f} ({100 * flops / (ceiling_bf16 if half else ceiling):.0f}%){tail}"
              for head, flops, tail, half in rows]
    notes.append(f"decoder GFLOP/s: the arithmetic a generated token needs per hypothesis (beam: x beam size), "
                 f"against the matrix-multiply ceiling measured in this run (torch.mm, 1024^3, best of two "
                 f"measurements): fp32 {ceiling:.0f} GFLOP/s; bf16 {ceiling_bf16:.0f} GFLOP/s (tformer-bf16's %)")
    if args.memory:
        memory = ["| engine | peak RSS (MiB) | RSS after decoding (MiB) | of which the imports (MiB) |",
                  "|---|---:|---:|---:|"]
        batch_size, beam = args.batch_size[-1], args.beams[-1]
        chunks = [order[i : i + batch_size] for i in range(0, min(4 * batch_size, len(order)), batch_size)]
        for engine in ["none"] + [e for e in engines if e not in ("tformer-ids", "tformer-top_k", "hf")]:
            spec = dict(engine=engine, beam=beam, max_len=max_len, threads=threads, source=str(source_ckpt),
                        ct2_dir=str(ct2_dirs.get(engine, "")), sentences=[[sources[i] for i in c] for c in chunks],
                        pieces=[[pieces[i] for i in c] for c in chunks])
            (work / "spec.json").write_text(json.dumps(spec))
            got = json.loads(subprocess.run([sys.executable, __file__, "--rss-child", str(work / "spec.json")],
                                            capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            memory.append(f"| {'(imports alone)' if engine == 'none' else engine} | {got['VmHWM']:,.0f} | "
                          f"{got['VmRSS']:,.0f} | {got['imports']:,.0f} |")
        table += ["", *memory]
        notes.append(f"RSS: each engine in a fresh process of its own (/proc/self/status VmHWM, VmRSS; the "
                     f"imports: VmRSS after importing torch and ctranslate2), loading only that engine "
                     f"and decoding 4 batches of {batch_size} at {'greedy' if beam == 1 else f'beam {beam}'}; "
                     f"tformer's prepacked weights (tformer.model.matmul) and int8 copies are included")
    what = ("random post-norm Marian-size model (d=256, 3+3, 4 heads, FFN 1024)" if args.random else
            "random OPUS-MT-base-shaped Hugging Face folder (d=512, 6+6, 8 heads, FFN 2048, swish), imported"
            if args.opus_base else f"Hugging Face folder {folder}, imported" if folder else
            f"checkpoint {args.checkpoint} ({cfg.norm}-norm, d={cfg.d_model}, {cfg.encoder_layers}+"
            f"{cfg.decoder_layers} layers)")
    import ctranslate2
    import transformers

    notes.append(f"{len(ids)} Multi30k test2016 sentences, {what}, vocabulary {vocab}, length penalty 0 "
                 f"everywhere, output limit {max_len} tokens, {threads} threads each, median of {args.rounds} "
                 f"rounds with the engines taking turns; torch {torch.__version__}, CTranslate2 "
                 f"{ctranslate2.__version__}, transformers {transformers.__version__}"
                 + ("" if "hf" in engines else "; MarianMT is post-norm only, so it sits out for this model")
                 + ("; CTranslate2 converted the folder with its own TransformersConverter" if folder else "")
                 + "; each CTranslate2 model in a worker process of its own, timed there (ct2_worker.py)")
    print("\n".join(table))
    print("\n".join(notes))
    if args.record:
        title = ("Decoding an imported OPUS-MT-base-shaped model beside CTranslate2 and Hugging Face" if args.opus_base
                 else "Decoding beside CTranslate2 and Hugging Face" + (" (random model)" if args.random else ""))
        append_results(title, "\n".join(table), "\n\n".join(notes))


if __name__ == "__main__":
    main()
