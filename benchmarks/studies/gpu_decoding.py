"""Decoding on a GPU, fp32 and bf16, beside Hugging Face `generate` on the same GPU and weights, in one run.

    python benchmarks/studies/gpu_decoding.py --opus-base [--batch-size 1 32 128] [--beams 1 4] [--rounds 2] [--out FILE]
    python benchmarks/studies/gpu_decoding.py --checkpoint RUN [--out FILE]     (a trained model: bf16's quality)

--opus-base: a random OPUS-MT-base-shaped Hugging Face folder (d 512, 6+6 layers, a 58,101-entry table; built as
benchmarks/decoding_peers.py builds it), loaded by tformer (`tformer.load(folder, device="cuda")`, and with
precision="bf16") and by Hugging Face (`MarianMTModel.from_pretrained(folder)`, and with dtype=bfloat16).
The engines take turns batch by batch over the same length-sorted batches of Multi30k test2016 sources (batch 1:
the first --latency-sentences of them); random weights run every output to --max-len tokens. The clock stops
after torch.cuda.synchronize(). The table gives the median over rounds, each engine's ratio to Hugging Face in
the same precision, and how many outputs equal tformer fp32's.
--checkpoint: a trained tformer run. Its test2016 translations (beam 5) in fp32 and in bf16 on the GPU:
sacreBLEU of each, how many outputs differ, and how many of the GPU's fp32 outputs equal the CPU's.
Either way the tables go to stdout and, with --out, to FILE (markdown).
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
from common import SHARED_DATA  # noqa: E402
from decoding_peers import opus_base_folder  # noqa: E402

import tformer  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def _lines(name: str) -> list[str]:
    with gzip.open(SHARED_DATA / "multi30k" / name, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def _say(out: Path | None, text: str) -> None:
    print(text, flush=True)
    if out is not None:
        with out.open("a", encoding="utf-8") as f:
            f.write(text + "\n")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def speed(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="tformer-gpu-"))
    folder = opus_base_folder(work / "opus-base")
    device = torch.device(args.device)
    import transformers
    from transformers import MarianMTModel

    transformers.logging.set_verbosity_error()  # generate's notice, per call, that max_new_tokens overrides max_length

    engines = {"tformer-fp32": tformer.load(folder, device=device),
               "tformer-bf16": tformer.load(folder, device=device, precision="bf16")}
    hf = {"hf-fp32": MarianMTModel.from_pretrained(folder).eval().to(device),
          "hf-bf16": MarianMTModel.from_pretrained(folder, dtype=torch.bfloat16).eval().to(device)}
    translator = engines["tformer-fp32"]
    src_tok, tgt_tok = translator.checkpoint.tokenizers
    sources = _lines("test2016.en.gz")[: args.sentences]
    ids = [translator.encode(s) for s in sources]
    src_out = src_tok.original  # tformer id -> the folder's id
    tgt_in = {m: i for i, m in enumerate(tgt_tok.original)}
    stoi = tgt_tok.vocab.stoi
    config = hf["hf-fp32"].config
    hf_eos, hf_pad = config.eos_token_id, config.pad_token_id

    def run(engine: str, beam: int, chunk: list[int]) -> list[list[int]]:
        if engine.startswith("tformer"):
            out = engines[engine].translate([sources[i] for i in chunk], beam=beam, len_penalty=0.0, max_len_a=0.0,
                                            max_len_b=args.max_len, batch_size=len(chunk))
            return [[stoi.get(p, 3) for p in t.tokens] for t in out]
        inp = torch.nn.utils.rnn.pad_sequence([torch.tensor([src_out[t] for t in ids[i]] + [hf_eos]) for i in chunk],
                                              batch_first=True, padding_value=hf_pad).to(device)
        extra = dict(length_penalty=0.0) if beam > 1 else {}
        with torch.inference_mode():
            gen = hf[engine].generate(input_ids=inp, attention_mask=inp != hf_pad, num_beams=beam,
                                      max_new_tokens=args.max_len, do_sample=False, suppress_tokens=[hf_pad],
                                      forced_eos_token_id=None, **extra)
        result = []
        for row in gen.tolist():
            row = row[1:]
            row = [t for t in (row[: row.index(hf_eos)] if hf_eos in row else row) if t != hf_pad]
            result.append([tgt_in[t] for t in row])
        return result

    names = list(engines) + list(hf)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    _say(args.out, f"\n{torch.cuda.get_device_name(device) if device.type == 'cuda' else device}, torch "
                   f"{torch.__version__}, {len(sources)} Multi30k test2016 sources (batch 1: the first "
                   f"{args.latency_sentences}), outputs of {args.max_len} tokens, median of {args.rounds} rounds\n")
    _say(args.out, "| decoding | batch | engine | sentences/s | target tokens/s | ms per call | vs Hugging Face "
                   "of its precision | equal to tformer fp32 |\n|---|---:|---|---:|---:|---:|---:|---:|")
    for batch_size in args.batch_size:
        rows = order[: args.latency_sentences] if batch_size == 1 else order
        chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        for beam in args.beams:
            for name in names:  # warm-up: lazy initialisation, the allocator, kernel choices
                run(name, beam, chunks[0])
            times: dict[str, list[float]] = {n: [] for n in names}
            calls: dict[str, list[float]] = {n: [] for n in names}
            outputs: dict[str, list[list[int]]] = {n: [[] for _ in ids] for n in names}
            for _ in range(args.rounds):
                spent = dict.fromkeys(names, 0.0)
                for c, chunk in enumerate(chunks):
                    for name in names[c % len(names):] + names[: c % len(names)]:
                        _sync()
                        tic = time.perf_counter()
                        out = run(name, beam, chunk)
                        _sync()
                        spent[name] += time.perf_counter() - tic
                        calls[name].append(time.perf_counter() - tic)
                        for i, hyp in zip(chunk, out):
                            outputs[name][i] = hyp
                for name in names:
                    times[name].append(spent[name])
            for name in names:
                secs = statistics.median(times[name])
                peer = "hf-bf16" if name.endswith("bf16") else "hf-fp32"
                got = [outputs[name][i] for i in rows]
                want = [outputs["tformer-fp32"][i] for i in rows]
                n_tok = sum(len(h) + 1 for h in got)
                _say(args.out, f"| {'greedy' if beam == 1 else f'beam {beam}'} | {batch_size} | {name} | "
                               f"{len(rows) / secs:.1f} | {n_tok / secs:,.0f} | "
                               f"{1000 * statistics.median(calls[name]):.1f} | "
                               f"{statistics.median(times[peer]) / secs:.2f}x | "
                               f"{sum(a == b for a, b in zip(got, want))}/{len(rows)} |")


def quality(args) -> None:
    device = torch.device(args.device)
    n = args.quality_sentences or None
    sources, refs = _lines("test2016.en.gz")[:n], _lines("test2016.de.gz")[:n]
    found = {}
    for name, where, kw in (("fp32", device, {}), ("bf16", device, dict(precision="bf16")), ("cpu fp32", "cpu", {})):
        translator = tformer.load(args.checkpoint, device=where, **kw)
        _sync()
        tic = time.perf_counter()
        found[name] = [t.text for t in translator.translate(sources, beam=5, batch_size=128)]
        _sync()
        found[name + " s"] = time.perf_counter() - tic
    _say(args.out, f"\n{args.checkpoint} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else device}"
                   f", test2016 ({len(sources)} sentences), beam 5, batch 128\n")
    _say(args.out, "| decoding | sacreBLEU | lowercased tokenized BLEU | seconds | outputs unlike GPU fp32's |\n"
                   "|---|---:|---:|---:|---:|")
    for name in ("fp32", "bf16", "cpu fp32"):
        scores = translation_scores(found[name], refs, "de")
        differ = sum(a != b for a, b in zip(found[name], found["fp32"]))
        _say(args.out, f"| {name if name.startswith('cpu') else 'GPU ' + name} | {scores.bleu:.2f} | "
                       f"{scores.tok_bleu_lc:.2f} | "
                       f"{found[name + ' s']:.1f} | {differ} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opus-base", action="store_true", help="speed beside Hugging Face on a random OPUS-MT-base shape")
    ap.add_argument("--checkpoint", help="a trained run: bf16 against fp32 on test2016")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--latency-sentences", type=int, default=16, help="sentences decoded one at a time (batch 1)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--quality-sentences", type=int, default=0, help="--checkpoint: the first N of test2016 (0: all)")
    ap.add_argument("--out", type=Path, help="also append the tables to this markdown file")
    args = ap.parse_args()
    if not (args.opus_base or args.checkpoint):
        ap.error("say --opus-base, --checkpoint RUN, or both")
    if args.checkpoint:
        quality(args)
    if args.opus_base:
        speed(args)


if __name__ == "__main__":
    main()
