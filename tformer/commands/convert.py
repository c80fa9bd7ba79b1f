"""tformer import: a model trained elsewhere (a Hugging Face MarianMT / OPUS-MT or M2M-100 folder, a Marian
folder) as a tformer run folder."""

from __future__ import annotations

import argparse

from tformer.convert import FORMATS


def add_parser(sub) -> None:
    sp = sub.add_parser("import", help="convert a Hugging Face Marian or M2M-100, or a Marian (OPUS-MT) model into a "
                        "tformer run folder",
                        description="hf-marian: a local folder with config.json, model.safetensors (or "
                        "pytorch_model.bin, read without unpickling code), source.spm, target.spm and vocab.json, "
                        "as `transformers` saves a MarianMTModel. The run folder it writes translates, scores, "
                        "serves and fine-tunes like one tformer trained; every --checkpoint flag also reads the "
                        "Hugging Face folder directly (converted in memory each time). Nothing is downloaded: "
                        "fetch a hub model first (huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir "
                        "opus-mt-en-de). marian: a Marian model folder as OPUS-MT publishes it (decoder.yml, the .npz, "
                        "*.vocab.yml, source.spm, target.spm), with Marian's own position table. hf-m2m100: an "
                        "M2M100ForConditionalGeneration folder (config.json, the weights, sentencepiece.bpe.model, "
                        "vocab.json, tokenizer_config.json), which translates between its 100 languages "
                        "(--source en --target fr); hf-nllb: an NLLB-200 folder (the same network; "
                        "tokenizer.json, --source eng_Latn --target fra_Latn); hf-mbart: an mBART-50 folder "
                        "(--source en_XX --target fr_XX). Example: tformer import hf-marian opus-mt-en-de "
                        "runs/opus-en-de")
    sp.add_argument("format", choices=FORMATS, help="the folder's kind")
    sp.add_argument("src", metavar="SRC", help="the folder to read")
    sp.add_argument("out", metavar="OUT", help="the run folder to write (must not exist)")
    sp.add_argument("--force", action="store_true", help="replace OUT if it exists")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.convert import import_model

    ckpt = import_model(args.format, args.src, args.out, force=args.force)
    print(f"wrote {ckpt} from {args.src}; translate with: tformer translate --checkpoint {args.out}")
    return 0
