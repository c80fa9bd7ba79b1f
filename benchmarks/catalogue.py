"""The benchmarks the results pages know: each name's topic and section title, and the README's headline rows.

A section's heading (and so its anchor) comes from this table, keyed by the benchmark's name: no date, no count,
no position enters it, so a new record or a new benchmark never moves an existing anchor. A record whose
benchmark is not listed here is refused by the renderer: add a line here first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    topic: str
    title: str       # the section heading on the topic page (letters, digits, spaces, '-' and ',' only)
    about: str       # one sentence under the heading: what is measured, and by which script


BENCHMARKS: dict[str, Entry] = {
    # quality
    "quality": Entry("quality", "Quick recipe quality multi30k_quick",
                     "`multi30k_quick` trained from scratch, test2016 sacreBLEU; `python -m benchmarks run quality`."),
    "multi30k-en-de": Entry("quality", "Multi30k en-de with multi30k_en_de",
                            "test2016 sacreBLEU of the 95-minute recipe, beam 5 (`benchmarks/translation.py`)."),
    "multi30k-tiny-2h": Entry("quality", "Multi30k en-de in the 2-hour budget with multi30k_tiny",
                              "test2016 BLEU, candidates chosen on validation (`benchmarks/multi30k_quality.py`)."),
    "fra-en": Entry("quality", "fra-en Tatoeba with fra_en",
                    "test sacreBLEU and chrF, candidates chosen on validation (`benchmarks/multi30k_quality.py`)."),
    # decoding
    "decode": Entry("decoding", "Decoding speed beside CTranslate2",
                    "tformer against CTranslate2 in one run, Multi30k test2016 sources "
                    "(`benchmarks/decoding_peers.py`; `python -m benchmarks run decode`)."),
    "decode-opus-base": Entry("decoding", "Decoding an OPUS-MT-base-shaped model beside CTranslate2",
                              "d 512, 6+6, vocabulary 58k, CTranslate2 in tformer's process "
                              "(`benchmarks/decoding_peers.py --opus-base`)."),
    "decode-opus-base-isolated": Entry("decoding", "Decoding an OPUS-MT-base-shaped model, CTranslate2 isolated",
                                       "each CTranslate2 model in a process of its own "
                                       "(`benchmarks/decoding_peers.py --folder`)."),
    "decode-bf16": Entry("decoding", "bf16 decoding of a small trained model",
                         "`multi30k_quick`, test2016, batch 64, `--precision bf16` against fp32."),
    "constraints": Entry("decoding", "Lexically constrained beam search",
                         "1-3 reference words per sentence as constraints, `multi30k_quick`, test2016, beam 5."),
    # training
    "train": Entry("training", "Training throughput beside torch.nn.Transformer",
                   "tokens/s of tformer against the textbook set-up of the same size, on the same batches "
                   "(`benchmarks/train_throughput.py`; `python -m benchmarks run train`)."),
    "demo": Entry("training", "tformer demo, the copy recipe",
                  "the copy recipe from the command line: wall time and exact match."),
    "corpus-prepare": Entry("training", "Preparing WMT14 en-de at corpus scale",
                            "`tformer prepare` on 4.5M pairs (`benchmarks/corpus_scale.py`)."),
    # serving
    "serve": Entry("serving", "tformer serve under concurrent load",
                   "cross-request batching against the same server answering one by one "
                   "(`benchmarks/serve_load.py`; `python -m benchmarks run serve`)."),
    "serve-abuse": Entry("serving", "tformer serve under slow clients and malformed requests",
                         "slowloris connections and a flood of malformed requests (`benchmarks/serve_abuse.py`)."),
    # reliability
    "suite": Entry("reliability", "Test suite wall time",
                   "the README's test command on a fresh clone (`python -m benchmarks run suite`)."),
    "mutation": Entry("reliability", "Mutation testing of the mathematical core",
                      "mutants killed of those that can change behaviour (`benchmarks/mutation.py`)."),
    # interop
    "finetune-hf": Entry("interop", "Fine-tuning through Hugging Face",
                         "export to Hugging Face Marian, import, fine-tune (`benchmarks/studies/finetune_roundtrip.py`)."),
    "argos": Entry("interop", "Argos Translate package",
                   "`tformer export --format argos` against tformer itself (`benchmarks/studies/argos.py`)."),
}


@dataclass(frozen=True)
class Headline:
    task: str        # what the row measures, in a few words
    benchmark: str
    figure: str      # the figure's name in the benchmark's records


HEADLINE: list[Headline] = [
    Headline("Multi30k en-de, multi30k_en_de, test2016 beam 5", "multi30k-en-de", "sacreBLEU, best checkpoint"),
    Headline("Multi30k en-de in 2 hours, multi30k_tiny", "multi30k-tiny-2h",
             "lowercased tokenized BLEU, ensemble of two runs"),
    Headline("training d 256 3+3, vocabulary 8k", "train", "tokens/s vs torch.nn.Transformer, small, fp32"),
    Headline("decoding Multi30k batch 64, beam 5", "decode", "beam 5 fp32 vs CTranslate2 fp32, batch 64"),
    Headline("decoding OPUS-MT-base shape, beam 4 batch 32", "decode-opus-base-isolated",
             "beam 4 batch 32 fp32 vs CTranslate2 fp32"),
    Headline("tformer serve, 16 clients, greedy", "serve", "throughput vs one by one, 16 clients"),
    Headline("test suite on a fresh clone", "suite", "pytest wall time"),
    Headline("tformer demo, the copy recipe", "demo", "wall time"),
]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (MyST's default slug gives the same for these titles)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchor(name: str) -> str:
    """The anchor of benchmark `name`'s section: a function of its name alone."""
    return slug(BENCHMARKS[name].title)


def label(name: str) -> str:
    """The MyST target above the section, for cross-references from other pages: (results-NAME)=."""
    return f"results-{name}"
