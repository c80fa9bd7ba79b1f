"""A token <-> id vocabulary with the four specials every model here uses, saved as plain text."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tformer.errors import DataError

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)


class Vocab:
    """Ids 0..3 are <pad>, <s>, </s>, <unk>; the rest in the order given."""

    pad, bos, eos, unk = 0, 1, 2, 3

    def __init__(self, tokens: Iterable[str]) -> None:
        self.itos: list[str] = list(SPECIALS)
        for tok in tokens:
            if tok not in SPECIALS:
                self.itos.append(tok)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary has duplicate tokens")

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def encode(self, tokens: list[str]) -> list[int]:
        return [self.stoi.get(t, self.unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> tokens, stopping at </s> and dropping <pad>/<s>."""
        out = []
        for i in ids:
            if i == self.eos:
                break
            if i not in (self.pad, self.bos):
                out.append(self.itos[i])
        return out

    @classmethod
    def build(cls, sentences: Iterable[list[str]]) -> "Vocab":
        """Tokens in order of first appearance (deterministic for a given corpus)."""
        seen: dict[str, None] = {}
        for sent in sentences:
            for tok in sent:
                seen.setdefault(tok, None)
        return cls(seen)

    def dumps(self) -> bytes:
        """The file `save` writes: one entry per line, UTF-8."""
        return "".join(t + "\n" for t in self.itos).encode("utf-8")

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.dumps())

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except FileNotFoundError:
            raise DataError(f"vocabulary file {path} does not exist") from None
        except UnicodeDecodeError as e:
            raise DataError(f"vocabulary file {path} is not UTF-8 (byte {e.start})") from None
        if lines and lines[-1] == "":
            lines.pop()
        if tuple(lines[:4]) != SPECIALS:
            raise DataError(f"vocabulary file {path} must start with {', '.join(SPECIALS)} (one per line)")
        for n, tok in enumerate(lines, 1):
            if not tok or any(c.isspace() for c in tok):
                raise DataError(f"{path}, line {n}: a token must be non-empty with no whitespace, got {tok!r}")
        return cls(lines[4:])
