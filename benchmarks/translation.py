"""Translation quality and decoding speed of a trained run.

    python benchmarks/translation.py quality RUN_DIR [--split test] [--beams 1 5] [--record]
    python benchmarks/translation.py speed RUN_DIR [--batch-sizes 1 64] [--beams 1 5] [--limit N] [--record]

quality: the run's best checkpoint (chosen on validation BLEU during training, never on test) decodes the
split with each beam size; the table gives sacreBLEU (cased, 13a), chrF and tokenized BLEU (Moses
tokenizer, cased) with their signatures, plus the training wall time and mean training tokens/s read from
the run's metrics.jsonl.

speed: sentences/s and generated target tokens/s (</s> included) for each (beam, batch size), the model
loaded once, one warm-up batch first, sentences in file order (translate_ids sorts each chunk by length).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import append_results  # noqa: E402

from tformer.config import to_dict  # noqa: E402
from tformer.data import load_task  # noqa: E402
from tformer.inference import load_model, translate_ids  # noqa: E402
from tformer.metrics import translation_scores  # noqa: E402


def _decode_cfg(cfg, beam: int, batch: int):
    strategy = "greedy" if beam == 1 else "beam"
    return dataclasses.replace(cfg.decode, strategy=strategy, beam_size=beam, nbest=1, batch_size=batch)


def training_summary(run_dir: Path) -> tuple[float, float, int]:
    """(wall seconds of training incl. evaluations, mean training tokens/s, steps) from metrics.jsonl."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in recs if r["kind"] == "train"]
    latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    info = json.loads((latest / "trainer.json").read_text())  # the last save: a run stopped by Ctrl-C included
    return info["elapsed"], sum(r["tok_per_s"] for r in train) / len(train), info["step"]


def quality(args) -> None:
    ckpt, model = load_model(args.run, which="best")
    cfg = ckpt.cfg
    data = load_task(cfg.data, (args.split,), tokenizers=ckpt.tokenizers)
    sources, refs = data.texts[args.split]
    src_ids = [s for s, _ in data.examples[args.split]]
    wall, tok_s, steps = training_summary(Path(args.run))
    best = json.loads((ckpt.path / "trainer.json").read_text())
    rows = ["| decoding | sacreBLEU | chrF | tokenized BLEU | decode time |", "|---|---|---|---|---|"]
    sigs = None
    for beam in args.beams:
        dcfg = _decode_cfg(cfg, beam, args.batch_size)
        tic = time.perf_counter()
        out = translate_ids(model, src_ids, dcfg)
        seconds = time.perf_counter() - tic
        hyps = [ckpt.tokenizers[1].decode(n[0]) for n in out.tokens]
        s = translation_scores(hyps, refs, cfg.data.tgt_lang)
        sigs = s
        name = "greedy" if beam == 1 else f"beam {beam}, alpha {cfg.decode.len_penalty}"
        rows.append(f"| {name} | **{s.bleu:.2f}** | {s.chrf:.2f} | {s.tok_bleu:.2f} | {seconds:.1f} s |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    notes = (f"Run `{args.run}`: {steps} steps, training wall time {wall / 60:.1f} min (validation decodes "
             f"included), mean {tok_s:.0f} source+target tokens/s; checkpoint {ckpt.path.name} chosen on "
             f"validation BLEU (valid BLEU {best.get('best', {}).get('bleu', float('nan')):.2f} greedy). "
             f"{len(refs)} {args.split} sentences.\n\nSignatures: sacreBLEU `{sigs.bleu_signature}`; chrF "
             f"`{sigs.chrf_signature}`; tokenized BLEU `{sigs.tok_bleu_signature}`.\n\nModel: "
             f"{json.dumps(to_dict(cfg.model))}\n\nData: {json.dumps(to_dict(cfg.data))}")
    print("\n" + table + "\n\n" + notes)
    if args.record:
        append_results(f"Translation quality: {Path(args.run).name}, {args.split}", table, notes)


def speed(args) -> None:
    torch.set_num_threads(args.threads) if args.threads else None
    ckpt, model = load_model(args.run, which="best")
    cfg = ckpt.cfg
    data = load_task(cfg.data, (args.split,), tokenizers=ckpt.tokenizers)
    src_ids = [s for s, _ in data.examples[args.split]][: args.limit or None]
    rows = ["| decoding | batch | sentences/s | target tokens/s | wall |", "|---|---|---|---|---|"]
    for beam in args.beams:
        for batch in args.batch_sizes:
            dcfg = _decode_cfg(cfg, beam, batch)
            translate_ids(model, src_ids[:batch], dcfg)  # warm-up
            tic = time.perf_counter()
            out = translate_ids(model, src_ids, dcfg)
            seconds = time.perf_counter() - tic
            n_tok = sum(len(n[0]) + 1 for n in out.tokens)
            name = "greedy" if beam == 1 else f"beam {beam}"
            rows.append(f"| {name} | {batch} | {len(src_ids) / seconds:.1f} | {n_tok / seconds:.0f} | "
                        f"{seconds:.1f} s |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    notes = (f"{len(src_ids)} sentences of {args.split} ({Path(args.run).name}, checkpoint {ckpt.path.name}), "
             f"kernel {cfg.model.attention}, max length {cfg.decode.max_len_a}*src+{cfg.decode.max_len_b}; "
             "tokens counted with </s>. One process, nothing else running.")
    print("\n" + table + "\n\n" + notes)
    if args.record:
        append_results(f"Decoding speed: {Path(args.run).name}, {args.split}", table, notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("quality", "speed"))
    ap.add_argument("run", help="run folder")
    ap.add_argument("--split", default="test")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--batch-size", type=int, default=128, help="quality: decoding batch")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64], help="speed: batch sizes")
    ap.add_argument("--limit", type=int, default=0, help="speed: first N sentences only")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--record", "--append", dest="record", action="store_true",
                    help="append the table to benchmarks/RESULTS.md (--append: the old spelling)")
    args = ap.parse_args()
    quality(args) if args.what == "quality" else speed(args)


if __name__ == "__main__":
    main()
