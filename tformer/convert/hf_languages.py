"""The vocabularies of the multilingual tokenizers Hugging Face took over from fairseq (M2M100Tokenizer,
NllbTokenizer, MBart50Tokenizer), read into tformer's layout.

All three number fairseq's dictionary first (<s> 0, <pad> 1, </s> 2, <unk> 3, then the SentencePiece pieces),
then a token per language, then a few more entries:

    family   tokenizer_class    the ids from                          language tokens   then
    m2m100   M2M100Tokenizer    vocab.json; the languages named by    __en__            madeupword0000 ...
                                tokenizer_config.json's language_codes
    nllb     NllbTokenizer      tokenizer.json (else piece id + 1)    eng_Latn          <mask>
    mbart50  MBart50Tokenizer   tokenizer.json (else piece id + 1)    en_XX             <mask>

A model's embedding table may hold more rows than its tokenizer names (NLLB-200's two): they are kept as
`<unusedN>` entries, so that export writes them back. The languages of nllb and mbart50 are the tokenizer's
own list (tokenizer_config.json's extra_special_tokens or additional_special_tokens), never one built in here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from tformer.convert.hf_marian import _json, check_pieces
from tformer.data.vocab import Vocab
from tformer.errors import CheckpointError

FAMILIES = {"M2M100Tokenizer": "m2m100", "NllbTokenizer": "nllb", "NllbTokenizerFast": "nllb",
            "MBart50Tokenizer": "mbart50", "MBart50TokenizerFast": "mbart50"}  # tokenizer_class -> family
TAGS = {"m2m100": "__{}__", "nllb": "{}", "mbart50": "{}"}  # a language's token: TAGS[family].format(code)
M2M_CODES = {  # fairseq's language lists for M2M-100, in the order their tokens follow the dictionary
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi "
               "hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns "
               "oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh "
               "zu").split(),
    "wmt21": ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"],
}
FAIRSEQ = ("<s>", "<pad>", "</s>", "<unk>")  # the dictionary's first four ids
BOS = "<bos>"  # fairseq's <s> (id 0), which tformer's layout keeps as an ordinary entry
MASK = "<mask>"


class Table(NamedTuple):
    """A folder's tokenizer as tformer reads it."""

    family: str  # m2m100, nllb or mbart50
    vocab: Vocab  # tformer's layout
    rows: list[int]  # per tformer id, the original id (the weights' row)
    codes: list[str]  # the languages, as a request names them
    tag: str  # data.language_tag
    controls: list[str]  # entries decoding leaves out of the text (the language tokens, <mask>)
    spm: Path  # the SentencePiece model
    settings: dict  # tokenizer_config.json (src_lang, tgt_lang, ...)


def family_of(tok_cfg: dict, folder: Path) -> str:
    """The family of a folder's tokenizer_config.json (M2M-100's when it names none and vocab.json is there)."""
    name = tok_cfg.get("tokenizer_class")
    if name is None and (folder / "vocab.json").is_file():
        return "m2m100"
    if name not in FAMILIES:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: tokenizer_class {name!r}; tformer reads "
                              f"{', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def read_table(folder: Path, size: int) -> Table:
    """The vocabulary of `folder` (module docstring) for an embedding table of `size` rows."""
    tok_cfg = _json(folder / "tokenizer_config.json", "tokenizer_config.json (the tokenizer's languages)")
    if not isinstance(tok_cfg, dict):
        raise CheckpointError(f"{folder / 'tokenizer_config.json'} must be a JSON object")
    family = family_of(tok_cfg, folder)
    spm = folder / "sentencepiece.bpe.model"
    if not spm.is_file():
        raise CheckpointError(f"{spm} does not exist: a {family} folder needs its SentencePiece model")
    if family == "m2m100":
        names, codes = _m2m100(folder, tok_cfg)
        controls = [TAGS[family].format(c) for c in codes]
    else:
        if tok_cfg.get("legacy_behaviour"):
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: legacy_behaviour is true (the source's "
                                  "language token last); tformer puts it first, as NLLB-200 was trained")
        codes = _special_list(folder, tok_cfg)
        names = _from_tokenizer_json(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else (
            [*FAIRSEQ, *_spm_pieces(spm)[3:], *codes, MASK])
        missing = sorted(set(codes) - set(names))
        if missing:
            raise CheckpointError(f"{folder}: the languages {missing[:5]} have no id in its tokenizer files")
        controls = [*codes, MASK]
    where = folder / ("vocab.json" if family == "m2m100" else "tokenizer.json")
    if len(names) > size or (family == "m2m100" and len(names) != size):
        hint = " (check tokenizer_config.json's language_codes)" if family == "m2m100" else ""
        raise CheckpointError(f"{where}: the tokenizer names {len(names)} entries but config.json's 'vocab_size' is "
                              f"{size}; the vocabulary does not match the weights{hint}")
    names += [f"<unused{i}>" for i in range(len(names), size)]
    vocab, rows = arrange(names, where)
    return Table(family, vocab, rows, codes, TAGS[family], controls, spm, tok_cfg)


def arrange(names: list[str], file: Path) -> tuple[Vocab, list[int]]:
    """Entries by original id as tformer's Vocab and, per tformer id, the original id of its row: <pad>, the
    decoder's start (a copy of </s>), </s>, <unk>, fairseq's <s> as <bos>, then the others in their order."""
    for i, want in enumerate(FAIRSEQ):
        if names[i] != want:
            raise CheckpointError(f"{file}: id {i} is {names[i]!r}, not {want!r} (fairseq's dictionary)")
    rows = [1, 2, 2, 3, 0, *range(4, len(names))]
    others = [BOS] + names[4:]
    check_pieces(others, file)
    return Vocab(others), rows


def _m2m100(folder: Path, tok_cfg: dict) -> tuple[list[str], list[str]]:
    codes_name = tok_cfg.get("language_codes", "m2m100")
    if codes_name not in M2M_CODES:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: language_codes {codes_name!r}; tformer knows "
                              f"{', '.join(M2M_CODES)}")
    madeup = tok_cfg.get("num_madeup_words", 8)
    if not isinstance(madeup, int) or isinstance(madeup, bool) or madeup < 0:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: num_madeup_words must be a whole number")
    file = folder / "vocab.json"
    table = _json(file, "vocab.json (the pieces' ids)")
    names = _by_id(table, file)
    codes = M2M_CODES[codes_name]
    return names + [TAGS["m2m100"].format(c) for c in codes] + [f"madeupword{k:04d}" for k in range(madeup)], codes


def _by_id(table: Any, file: Path) -> list[str]:
    """A piece -> id map whose ids are 0 .. n-1, as the list of pieces by id."""
    if not isinstance(table, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in table.values()):
        raise CheckpointError(f"{file} must map each piece to a whole-number id")
    if set(table.values()) != set(range(len(table))):
        raise CheckpointError(f"{file}: its ids are not 0 .. {len(table) - 1}")
    piece = {i: p for p, i in table.items()}
    return [piece[i] for i in range(len(table))]


def _from_tokenizer_json(file: Path) -> list[str]:
    """Every entry of a tokenizers file by id: its model's vocabulary (a BPE map, or a Unigram list whose order is
    the ids) and its added tokens."""
    data = _json(file, "tokenizer.json")
    try:
        vocab = data["model"]["vocab"]
        table = dict(vocab) if isinstance(vocab, dict) else {p: i for i, (p, _) in enumerate(vocab)}
        for added in data.get("added_tokens", []):
            table[added["content"]] = added["id"]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{file}: no model.vocab or added_tokens a tokenizer.json has") from None
    return _by_id(table, file)


def _special_list(folder: Path, tok_cfg: dict) -> list[str]:
    """The language codes: the tokenizer's extra (additional) special tokens, from tokenizer_config.json or
    special_tokens_map.json."""
    sources = [tok_cfg]
    if (folder / "special_tokens_map.json").is_file():
        sources.append(_json(folder / "special_tokens_map.json", "special_tokens_map.json"))
    for source in sources:
        for key in ("extra_special_tokens", "additional_special_tokens"):
            value = source.get(key) if isinstance(source, dict) else None
            if isinstance(value, list) and value:
                codes = [x.get("content") if isinstance(x, dict) else x for x in value]
                return [c for c in codes if isinstance(c, str) and c not in (*FAIRSEQ, MASK)]
    raise CheckpointError(f"{folder / 'tokenizer_config.json'}: no extra_special_tokens (the language codes); "
                          "save the tokenizer with transformers' save_pretrained")


def _spm_pieces(file: Path) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(file.read_bytes())
    except (RuntimeError, OSError) as e:
        raise CheckpointError(f"{file} is not a SentencePiece model ({e})") from None
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]

