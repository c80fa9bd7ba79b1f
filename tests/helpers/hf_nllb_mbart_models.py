"""Tiny NLLB-200 and mBART-50 folders built offline (random weights, numbered as the published ones), and
transformers' generate as the oracle of tformer's greedy and beam outputs on them."""

from __future__ import annotations

import io
import json

import torch

from helpers.hf_marian_models import pieces, sentences

TEXTS = {"en": ["A dog runs on the beach.", "Two men are playing chess in a park.", "A girl."],
         "de": ["Ein Hund läuft am Strand.", "Zwei Männer spielen Schach."],
         "fr": ["Un chien court sur la plage.", "Deux hommes jouent aux échecs dans un parc.", "Une fille."]}
CODES = {"nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"},
         "mbart50": {"en": "en_XX", "de": "de_DE", "fr": "fr_XX"}}


def _spm(kind: str, size: int = 300) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences("en", 800) + sentences("de", 800) + sentences("fr", 800)),
        model_writer=buf, vocab_size=size, model_type=kind, num_threads=1, minloglevel=2)
    return buf.getvalue()


def _tokenizer(path, family: str, fairseq: bool = True):
    """transformers' tokenizer for the folder, saved into it: NLLB's numbered as fairseq numbers it (else as
    transformers 5 does: <mask> before the languages)."""
    from transformers import MBart50Tokenizer, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    cls = NllbTokenizer if family == "nllb" else MBart50Tokenizer
    settings = {"tokenizer_class": cls.__name__, "src_lang": CODES[family]["en"], "tgt_lang": CODES[family]["fr"]}
    if family == "nllb":
        settings["extra_special_tokens"] = FAIRSEQ_LANGUAGE_CODES
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    cls.from_pretrained(path).save_pretrained(path)
    if family == "nllb" and fairseq:  # fairseq's (and the published folders') numbering: the languages, then <mask>
        n = len(pieces((path / "sentencepiece.bpe.model").read_bytes())) + 1
        ids = {c: n + i for i, c in enumerate(FAIRSEQ_LANGUAGE_CODES)} | {"<mask>": n + len(FAIRSEQ_LANGUAGE_CODES)}
        spec = json.loads((path / "tokenizer.json").read_text())
        for added in spec["added_tokens"]:
            added["id"] = ids.get(added["content"], added["id"])
        (path / "tokenizer.json").write_text(json.dumps(spec))
    tok = cls.from_pretrained(path)
    if family == "nllb" and fairseq:
        assert tok.convert_tokens_to_ids("eng_Latn") == n + 46 and tok.convert_tokens_to_ids("<mask>") == n + 202
    return tok


def make_folder(path, family: str, *, seed: int = 0, d_model: int = 32, layers: int = 2, fairseq: bool = True):
    """A tiny NLLB-200 (M2M-100 network, BPE SentencePiece) or mBART-50 (mBART network, unigram) folder with
    random weights everywhere (layer norms and mBART's output bias too)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, MBartConfig, MBartForConditionalGeneration

    path.mkdir(parents=True)
    (path / "sentencepiece.bpe.model").write_bytes(_spm("bpe" if family == "nllb" else "unigram"))
    tok = _tokenizer(path, family, fairseq)
    size = len(tok) + (2 if family == "nllb" else 0)
    config, model_class = ((M2M100Config, M2M100ForConditionalGeneration) if family == "nllb" else
                           (MBartConfig, MBartForConditionalGeneration))
    cfg = config(vocab_size=size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
                 decoder_ffn_dim=2 * d_model, max_position_embeddings=64, dropout=0.0, init_std=0.3,
                 scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(seed)
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
        if family == "mbart50":
            model.final_logits_bias.normal_(0.0, 0.5)
        eos = model.model.shared.weight[2]
        lift = 5.8 if family == "nllb" else 5.5  # </s>'s logit + lift: outputs that end at varied lengths
        model.model.decoder.layer_norm.bias += lift * eos / eos.norm() ** 2
    model.save_pretrained(path)
    return path


def hf_pair(folder):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def original(t, ids):
    return [t.source_tokenizer.original[i] for i in ids]


def lang_id(tok, code: str) -> int:
    """The id of a language's token (M2M100Tokenizer names __fr__ 'fr')."""
    return tok.get_lang_id(code) if hasattr(tok, "get_lang_id") else tok.convert_tokens_to_ids(code)


def generate(hf, tok, texts, target: str, beams: int, alpha: float, n: int):
    with torch.no_grad():
        return hf.generate(**tok(texts, return_tensors="pt", padding=True), num_beams=beams, do_sample=False,
                           length_penalty=alpha, max_new_tokens=n, max_length=None, early_stopping=False,
                           forced_bos_token_id=lang_id(tok, target), output_scores=True,
                           return_dict_in_generate=True, forced_eos_token_id=None)  # mBART's config forces </s>


def check_outputs(t, hf, tok, source: str, target: str, texts: list[str], n: int = 20) -> set[int]:
    """tformer's greedy and beam outputs (tokens, text, score) equal generate's; the lengths seen."""
    tok.src_lang = source
    lengths = set()
    for beams, alpha in ((1, 1.0), (4, 1.0), (4, 0.6)):
        got = t.translate(texts, source=source, target=target, beam=beams, len_penalty=alpha,
                          len_penalty_rule="power", max_len_a=0.0, max_len_b=n, prefix_score="zero")  # as
        # generate scores a forced token (an imported model's default; a fine-tuned one's recipe has its own)
        gen = generate(hf, tok, texts, target, beams, alpha, n)
        wants = gen.sequences_scores.tolist() if beams > 1 else [None] * len(texts)
        for ours, row, want in zip(got, gen.sequences.tolist(), wants):
            row = row[1:]  # the decoder's start
            row = [x for x in (row[: row.index(2)] if 2 in row else row) if x != 1]
            assert original(t, [t.source_tokenizer.vocab.stoi[p] for p in ours.hypotheses[0].tokens]) == row, \
                (beams, alpha)
            assert row[0] == lang_id(tok, target)  # forced first, left out of the text
            words = [x for x in row[1:] if x not in getattr(tok, "id_to_lang_token", {})]  # M2M100Tokenizer
            assert ours.text == tok.decode(words, skip_special_tokens=True)  # keeps its languages' tokens
            lengths.add(len(row))
            if want is not None:
                assert abs(ours.hypotheses[0].score - want) <= 1e-5 * max(1.0, abs(want))
    return lengths


def check_teacher_forced(t, hf, tok, sources: list[str], targets: list[str], source: str, target: str) -> None:
    """tformer's teacher-forced logits (its start row left out) equal the folder's model's on a padded batch,
    relative difference <= 1e-5; the start's copy takes no probability; and `score` equals the log-probability
    of Hugging Face's labels (the target's token and </s> included, as its labels hold them)."""
    batch = tok(sources, text_target=targets, return_tensors="pt", padding=True)
    labels = batch["labels"]  # the target's token, y1 .. </s>, padded with 1
    dec_in = torch.cat([torch.full((len(labels), 1), 2), labels[:, :-1]], 1)
    dec_mask = (dec_in != 1).long()
    with torch.no_grad():
        ref = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=dec_in,
                 decoder_attention_mask=dec_mask).logits  # (B, T, V)
        ours = {m: i for i, m in enumerate(t.source_tokenizer.original)}  # 2 -> </s>; the start is tformer's <s>
        src = torch.tensor([[ours[m] for m in row] for row in batch.input_ids.tolist()])
        tgt = torch.tensor([[1] + [ours[m] for m in row[1:]] for row in dec_in.tolist()])
        src[batch.attention_mask == 0] = 0
        tgt[dec_mask == 0] = 0
        out = t.model(src, batch.attention_mask.sum(1), tgt, dec_mask.sum(1))
        logits = t.model.generator(out.padded())  # (B, T, V + 1)
    keep = [i for i in range(logits.shape[-1]) if i != 1]
    mine = torch.full_like(ref, float("nan"))
    mine[..., original(t, keep)] = logits[..., keep]
    real = dec_mask.bool()
    assert not mine.isnan().any()
    assert ((mine - ref).abs() / ref.abs().clamp(min=1))[real].max() <= 1e-5
    assert (logits.log_softmax(-1)[..., 1][real].exp() == 0).all()  # the start's copy takes no probability
    scored = t.score(sources, targets, source=source, target=target)
    lp = ref.log_softmax(-1).gather(2, labels.clamp(min=0)[..., None])[..., 0]  # (B, T)
    for got, row, mask in zip(scored, lp, labels != 1):
        want = float(row[mask].sum())
        assert abs(got.log_prob - want) <= 1e-5 * max(1.0, abs(want))
