"""Text <-> ids. `SubwordTokenizer` wraps a SentencePiece model trained here (ids 0..3 are <pad>, <s>, </s>,
<unk>, the same as `Vocab`, so SentencePiece ids are model ids); `WordTokenizer` splits on whitespace and
looks words up in a `Vocab` (the synthetic tasks and pre-tokenised text); `PieceTableTokenizer` cuts text into
SentencePiece pieces and looks the pieces up in a table of its own (imported Marian / OPUS-MT models, whose
vocab.json numbers the pieces differently from their SentencePiece models).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from tformer.data.vocab import SPECIALS, Vocab
from tformer.errors import ConfigError, DataError



class Tokenizer(Protocol):
    vocab: Vocab

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def fingerprint(self) -> str: ...


class WordTokenizer:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(text.split())

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.vocab.decode(ids))

    def fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self.vocab.itos).encode("utf-8")).hexdigest()


class SubwordTokenizer:
    """A SentencePiece model (BPE or unigram) whose ids are the model's ids."""

    kind = "subword"

    def __getstate__(self) -> dict:  # pickled as its model (encoding processes rebuild it)
        return {"model_bytes": self.model_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_bytes"])

    def __init__(self, model_bytes: bytes, name: str = "<memory>") -> None:
        import sentencepiece as spm

        self.model_bytes = model_bytes
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model_bytes)
        except (RuntimeError, OSError) as e:
            raise DataError(f"{name} is not a SentencePiece model ({e})") from None
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        if tuple(pieces[:4]) != SPECIALS:
            raise DataError(f"{name}: SentencePiece ids 0..3 must be {', '.join(SPECIALS)}, found "
                            f"{', '.join(pieces[:4])}; train it with `tformer` or with pad_id=0 bos_id=1 "
                            "eos_id=2 unk_id=3")
        self.vocab = Vocab(pieces[4:])

    @classmethod
    def load(cls, path: str | Path) -> "SubwordTokenizer":
        path = Path(path)
        try:
            return cls(path.read_bytes(), str(path))
        except FileNotFoundError:
            raise DataError(f"tokenizer file {path} does not exist") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.model_bytes)

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def sample_batch(self, texts: list[str], alpha: float, seed: int) -> list[list[int]]:
        """Sampled segmentations of `texts` (BPE-dropout with probability `alpha` for a BPE model, subword
        regularisation with smoothing `alpha` for a unigram one), the same for the same `seed` (SentencePiece's
        generator is process-wide: seeded here, then used in order, on one thread: its pool's threads would
        each draw from a generator of their own)."""
        import sentencepiece as spm

        spm.set_random_generator_seed(seed)
        return self.sp.encode(texts, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            if i == Vocab.eos:
                break
            if i > Vocab.eos:  # drop <pad> and <s>
                out.append(int(i))
        return self.sp.decode(out)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_bytes).hexdigest()


def train_sentencepiece(sentences: list[str], vocab_size: int, model_type: str = "bpe",
                        character_coverage: float = 1.0, seed_name: str = "", symbols: Sequence[str] = ()
                        ) -> SubwordTokenizer:
    """Train on `sentences` (the training split only). Deterministic: the input is written in the given
    order, sampling and shuffling are off and one thread trains. `symbols`: strings that are always one piece
    each (user-defined symbols: a multilingual model's <2xx> tokens)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(  # from memory to memory: no file path ends up inside the model
            sentence_iterator=iter([s for s in sentences if s]), model_writer=buf, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage, pad_id=0, bos_id=1, eos_id=2,
            unk_id=3, pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>",
            input_sentence_size=0, shuffle_input_sentence=False, num_threads=1, max_sentence_length=1 << 16,
            user_defined_symbols=list(symbols),
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ConfigError(f"SentencePiece could not train a {vocab_size}-piece {model_type} vocabulary"
                          f"{' for ' + seed_name if seed_name else ''}: {e}; lower data.vocab_size") from None
    return SubwordTokenizer(buf.getvalue(), "trained model")


class PieceTableTokenizer:
    """SentencePiece pieces looked up in a vocabulary of their own: the tokenizer of an imported Marian model.

    Text -> pieces (the SentencePiece model, no ids) -> `vocab` (tformer's layout: <pad> <s> </s> <unk>, then
    the other entries in the order of their ids in the original table); a piece missing from the table is
    <unk>. A leading target-language tag such as `>>deu<<` (multilingual OPUS-MT models) is one entry, never
    cut into pieces; MarianTokenizer does the same. `original` is the id each entry had in the imported table
    (the rows the weights were permuted by, kept for export; `tformer.convert`). `controls`: entries decoding
    leaves out of the text (M2M-100's language tokens, which start its outputs), as Hugging Face's
    skip_special_tokens does."""

    kind = "pieces"

    def __getstate__(self) -> dict:  # pickled as its files' contents (encoding processes rebuild it)
        return {"model_bytes": self.model_bytes, "pieces": self.vocab.itos[4:], "original": self.original,
                "controls": self.controls}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_bytes"], Vocab(state["pieces"]), state["original"],
                      controls=state.get("controls", ()))

    def __init__(self, model_bytes: bytes, vocab: Vocab, original: list[int], name: str = "<memory>",
                 controls: Sequence[str] = ()) -> None:
        import sentencepiece as spm

        if len(original) != len(vocab):
            raise DataError(f"{name}: {len(original)} original ids for a vocabulary of {len(vocab)} entries")
        self.model_bytes, self.vocab, self.original = model_bytes, vocab, list(original)
        self.controls = tuple(controls)
        self._dropped = frozenset(controls)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model_bytes)
        except (RuntimeError, OSError) as e:
            raise DataError(f"{name} is not a SentencePiece model ({e})") from None

    def encode(self, text: str) -> list[int]:
        tag = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            tag, text = [text[: end + 2]], text[end + 2 :]
        return self.vocab.encode(tag + self.sp.encode(text, out_type=str))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Entries the SentencePiece model does not know (a joint table's other-language pieces) keep their
        '▁' word marks through decode_pieces: they become spaces afterwards, as MarianTokenizer does."""
        pieces = [p for p in self.vocab.decode(ids) if p not in self._dropped]
        return self.sp.decode_pieces(pieces).replace("\u2581", " ").strip()

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.model_bytes)
        h.update(json.dumps([self.vocab.itos, self.original, *([list(self.controls)] if self.controls else [])]
                            ).encode("utf-8"))
        return h.hexdigest()

    def files(self, side: str) -> dict[str, bytes]:
        """What holds it beside its vocab.{side}.txt: spm.{side}.model and table.{side}.json (the original id of
        each entry)."""
        return {f"spm.{side}.model": self.model_bytes,
                f"table.{side}.json": json.dumps({"original_ids": self.original, **(
                    {"controls": list(self.controls)} if self.controls else {})}).encode("utf-8")}

    def save(self, folder: str | Path, side: str) -> None:
        for name, data in self.files(side).items():
            (Path(folder) / name).write_bytes(data)

    @classmethod
    def load(cls, folder: str | Path, side: str, vocab: Vocab) -> "PieceTableTokenizer":
        folder = Path(folder)
        model, table = folder / f"spm.{side}.model", folder / f"table.{side}.json"
        try:
            info = json.loads(table.read_text(encoding="utf-8"))
            ids, controls = info["original_ids"], info.get("controls", [])
            model_bytes = model.read_bytes()
        except FileNotFoundError as e:
            raise DataError(f"{e.filename} does not exist; the checkpoint is incomplete") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DataError(f"{table} is damaged ({e}); the checkpoint is corrupt") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise DataError(f"{table}: 'original_ids' must be a list of whole numbers; the checkpoint is corrupt")
        if not isinstance(controls, list) or not all(isinstance(c, str) for c in controls):
            raise DataError(f"{table}: 'controls' must be a list of entries; the checkpoint is corrupt")
        return cls(model_bytes, vocab, ids, str(model), controls)
