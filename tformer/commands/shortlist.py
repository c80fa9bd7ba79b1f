"""tformer shortlist: a lexical shortlist for a model from word alignments of a parallel corpus
(tformer.shortlist)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sp = sub.add_parser("shortlist", help="build a lexical shortlist (the output tokens each source token allows)",
                        description="Aligns --src and --tgt (the model's training corpus, or its distilled version) "
                        "with eflomal over the model's subword pieces, and writes OUT: the --first most frequent "
                        "target pieces, always allowed, and per source piece its --best target pieces by p(t|s) "
                        "(Marian's lexical shortlist; CTranslate2's vocabulary map). Decode with it: tformer "
                        "translate --shortlist OUT (each sentence may output only its list; the output layer is "
                        "computed for the batch's lists only), or export it: tformer export --format ctranslate2 "
                        "--shortlist OUT. Example: tformer shortlist --checkpoint runs/student --src train.en --tgt "
                        "train.de --out runs/student/shortlist.safetensors")
    sp.add_argument("--checkpoint", required=True, help="run or checkpoint folder whose vocabularies the list uses")
    sp.add_argument("--src", required=True, help="the corpus's source side, one sentence per line (plain or gzip)")
    sp.add_argument("--tgt", required=True, help="its target side, line-aligned")
    sp.add_argument("--out", required=True, help="the shortlist file to write (safetensors)")
    sp.add_argument("--first", type=int, default=100, metavar="N", help="the N most frequent target pieces, always "
                    "allowed (default 100)")
    sp.add_argument("--best", type=int, default=100, metavar="N", help="per source piece, its N most probable "
                    "target pieces (default 100)")
    sp.add_argument("--threshold", type=float, default=0.0, metavar="P", help="and only those with p(t|s) >= P "
                    "(default 0)")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.api import load
    from tformer.shortlist import build_shortlist

    translator = load(args.checkpoint, device="cpu")
    shortlist = build_shortlist(translator, args.src, args.tgt, first=args.first, best=args.best,
                                threshold=args.threshold)
    shortlist.save(args.out)
    sizes = [len(shortlist.candidates(s)) for s in range(shortlist.source_vocab)]
    print(f"wrote {args.out}: {len(shortlist.frequent)} frequent target pieces, {sum(sizes):,} candidates for "
          f"{sum(1 for n in sizes if n):,} source pieces, from {shortlist.settings['pairs']:,} aligned pairs")
    print(f"next: tformer translate --checkpoint {args.checkpoint} decode.shortlist={args.out}   (or tformer export "
          f"--format ctranslate2 --shortlist {args.out} ...)")
    return 0
