"""tformer export: a checkpoint as a CTranslate2 model folder, an Argos Translate package, a Hugging Face Marian
folder or ONNX graphs."""

from __future__ import annotations

import argparse

from tformer.export import FORMATS


def add_parser(sub) -> None:
    sp = sub.add_parser("export", help="export a checkpoint to CTranslate2, Argos Translate, Hugging Face (Marian, "
                        "M2M-100/NLLB, mBART) or ONNX",
                        description="ctranslate2: a CTranslate2 model folder, through CTranslate2's own converter "
                        "API, with the SentencePiece models beside it (source.spm, target.spm); the vocabularies "
                        "are the checkpoint's, </s> is added to every source. argos: an Argos Translate package, "
                        "OUT.argosmodel (the CTranslate2 model, int8 unless --quantization says otherwise, the "
                        "SentencePiece model, metadata; models with one SentencePiece model for both sides) that "
                        "argostranslate installs and LibreTranslate serves. hf-marian: a Hugging Face MarianMT "
                        "folder (config.json, model.safetensors, source.spm, target.spm, vocab.json) for "
                        "transformers' MarianMTModel and MarianTokenizer (post-norm models); an imported OPUS-MT "
                        "model gets its own ids and tensors back. hf-m2m100, hf-mbart: an imported M2M-100, "
                        "NLLB-200 or mBART-50 model (fine-tuned or not) as the folder it came from. onnx: "
                        "encoder.onnx (the encoder and the first decoding step) and step.onnx (one decoding step "
                        "with its key/value cache), dynamic batch and lengths. Vanilla models with sinusoidal or "
                        "learned positions, pre- or post-norm, ReLU, GELU or SiLU. The optional packages: pip "
                        "install 'tformer[export]' (CTranslate2, ONNX), 'tformer[hf]' (transformers). Example: "
                        "tformer export --format ctranslate2 runs/m30k runs/m30k-ct2 --quantization int8")
    sp.add_argument("--format", required=True, choices=FORMATS, help="target format")
    sp.add_argument("checkpoint", metavar="RUN_DIR", help="run folder (its best checkpoint) or checkpoint folder")
    sp.add_argument("out", metavar="OUT", help="folder to write")
    sp.add_argument("--quantization", choices=("int8", "int8_float32", "int16", "float16", "bfloat16"),
                    help="store the weights quantized (default: float32)")
    sp.add_argument("--shortlist", metavar="FILE", help="ctranslate2: a lexical shortlist (tformer shortlist) "
                    "written as the model's vocabulary map (vmap.txt; translate with use_vmap=True)")
    sp.add_argument("--force", action="store_true", help="replace OUT if it exists")
    sp.set_defaults(func=run)


USAGE = {  # how to use what each format wrote, printed after it ({out}: the folder or file)
    "argos": "install it with python -c \"import argostranslate.package as p; p.install_from_path('{out}')\"; "
             "LibreTranslate then serves it (ARGOS_CHUNK_TYPE=SPACY splits sentences offline with the packaged spaCy "
             "pipeline)",
    "hf-marian": "load it with transformers.MarianMTModel.from_pretrained('{out}') and "
                 "MarianTokenizer.from_pretrained('{out}')",
    "hf-m2m100": "load it with transformers.AutoModelForSeq2SeqLM.from_pretrained('{out}') and "
                 "AutoTokenizer.from_pretrained('{out}'); generate(..., forced_bos_token_id=the target's token)",
    "onnx": "{out}/encoder.onnx (encoder + first step) and {out}/step.onnx (one decoding step); "
            "tformer.export.onnx_greedy runs the decoding loop over them (onnxruntime)",
    "ctranslate2": "translate without tformer:\n"
                   "  import ctranslate2, sentencepiece as spm\n"
                   "  source = spm.SentencePieceProcessor(model_file='{out}/source.spm')\n"
                   "  target = spm.SentencePieceProcessor(model_file='{out}/target.spm')\n"
                   "  result = ctranslate2.Translator('{out}').translate_batch([source.encode('A dog runs.', "
                   "out_type=str)])\n"
                   "  print(target.decode(result[0].hypotheses[0]))\n"
                   "(a multilingual model's language tokens: tformer.export.translate_ctranslate2 adds them)",
}
USAGE["hf-mbart"] = USAGE["hf-m2m100"]


def run(args: argparse.Namespace) -> int:
    from tformer.export import export

    out = export(args.format, args.checkpoint, args.out, quantization=args.quantization, shortlist=args.shortlist,
                 force=args.force)
    details = [args.quantization or "", "vocabulary map vmap.txt (use_vmap=True)" if args.shortlist else ""]
    details = ", ".join(d for d in details if d)
    print(f"wrote {out} ({args.format}, from {args.checkpoint}{', ' + details if details else ''})")
    print(USAGE[args.format].format(out=out))
    return 0
