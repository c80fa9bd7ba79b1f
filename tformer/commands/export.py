"""tformer export: a checkpoint as a CTranslate2 model folder, an Argos Translate package, a Hugging Face Marian
folder or ONNX graphs."""

from __future__ import annotations

import argparse

from tformer.export import FORMATS


def add_parser(sub) -> None:
    sp = sub.add_parser("export", help="export a checkpoint to CTranslate2, Hugging Face Marian or ONNX",
                        description="ctranslate2: a CTranslate2 model folder, through CTranslate2's own converter "
                        "API (pip install ctranslate2); the vocabularies are the checkpoint's, </s> is added to "
                        "every source. hf-marian: a Hugging Face MarianMT folder (config.json, model.safetensors, "
                        "source.spm, target.spm, vocab.json) for transformers' MarianMTModel and MarianTokenizer "
                        "(pip install transformers; post-norm models); an imported OPUS-MT model gets its own ids "
                        "and tensors back. onnx: encoder.onnx (the encoder and the first decoding step) and "
                        "step.onnx (one decoding step with its key/value cache), dynamic batch and lengths "
                        "(pip install onnx onnxscript). argos: an Argos Translate package, OUT.argosmodel (the "
                        "CTranslate2 model, int8 unless --quantization says otherwise, the SentencePiece model, "
                        "metadata; models with one SentencePiece model for both sides) that argostranslate "
                        "installs and LibreTranslate serves. Vanilla models with sinusoidal or learned positions, "
                        "pre- or post-norm, ReLU, GELU or SiLU. Example: tformer export --format ctranslate2 "
                        "runs/m30k runs/m30k-ct2 --quantization int8")
    sp.add_argument("--format", required=True, choices=FORMATS, help="target format")
    sp.add_argument("checkpoint", metavar="RUN_DIR", help="run folder (its best checkpoint) or checkpoint folder")
    sp.add_argument("out", metavar="OUT", help="folder to write")
    sp.add_argument("--quantization", choices=("int8", "int8_float32", "int16", "float16", "bfloat16"),
                    help="store the weights quantized (default: float32)")
    sp.add_argument("--shortlist", metavar="FILE", help="ctranslate2: a lexical shortlist (tformer shortlist) "
                    "written as the model's vocabulary map (vmap.txt; translate with use_vmap=True)")
    sp.add_argument("--force", action="store_true", help="replace OUT if it exists")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.export import export

    out = export(args.format, args.checkpoint, args.out, quantization=args.quantization, shortlist=args.shortlist,
                 force=args.force)
    if args.format == "argos":
        print(f"wrote the Argos Translate package {out} (from {args.checkpoint}); install it with "
              f"python -c \"import argostranslate.package as p; p.install_from_path('{out}')\"; LibreTranslate then "
              "serves it (ARGOS_CHUNK_TYPE=SPACY splits sentences offline with the packaged spaCy pipeline)")
    elif args.format == "hf-marian":
        print(f"wrote the Hugging Face Marian folder {out} (from {args.checkpoint}); load it with "
              "transformers.MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained")
    elif args.format == "onnx":
        print(f"wrote {out / 'encoder.onnx'} (encoder + first step) and {out / 'step.onnx'} (one decoding step) from "
              f"{args.checkpoint}")
        print("see tformer.export.onnx_greedy for the decoding loop over them (onnxruntime)")
    else:
        print(f"wrote the CTranslate2 model {out} (from {args.checkpoint}"
              f"{', ' + args.quantization if args.quantization else ''}"
              f"{', vocabulary map vmap.txt (use_vmap=True)' if args.shortlist else ''})")
        print("translate with ctranslate2.Translator, feeding the checkpoint's pieces "
              "(tformer.export.translate_ctranslate2 does the tokenising)")
    return 0
