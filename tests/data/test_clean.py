"""Corpus cleaning (tformer.data.clean, `tformer data clean`) against a plain filter written out here, on real
Multi30k pairs with faults put in: each rule drops what it says and nothing else, the first failing rule is the
one counted, the kept pairs stay in order, cleaning twice drops nothing more, language identification drops the
swapped and untranslated pairs, and bad input leaves the outputs as they were."""

import gzip
import json
import subprocess
import sys

import pytest

from helpers.corpora import SHARED_DATA
from tformer.data.clean import REASONS, CleanRules, clean_files
from tformer.errors import ConfigError, DataError

M30K = SHARED_DATA / "multi30k"


def real_pairs(n=120):
    with gzip.open(M30K / "train.en.gz", "rt", encoding="utf-8") as f, \
            gzip.open(M30K / "train.de.gz", "rt", encoding="utf-8") as g:
        return [(a.rstrip("\n"), b.rstrip("\n")) for a, b, _ in zip(f, g, range(n))]


def faulty(pairs):
    """The real pairs with one fault of each kind every few lines, and the reason the plain filter gives it."""
    out = []
    for i, (a, b) in enumerate(pairs):
        out.append((a, b))
        fault = i % 8
        if fault == 1:
            out.append(("", b))
        elif fault == 2:
            out.append((a, " ".join(["lang"] * 300)))
        elif fault == 3:
            out.append((a, b + " " + " ".join(b.split() * 3)))
        elif fault == 4:
            out.append((a, a))
        elif fault == 5:
            out.append(("  " + a.replace(" ", "   "), b + " "))  # the same pair, other whitespace
        elif fault == 6:
            out.append((b, a))  # swapped
    return out


def plain(pairs, max_words=250, max_ratio=3.0, dedup=True, copies=True):
    """The rules written out, without the language check: (kept pairs, counts)."""
    kept, counts, seen = [], dict.fromkeys(REASONS, 0), set()
    for a, b in pairs:
        wa, wb = a.split(), b.split()
        reason = ("empty" if not wa or not wb else "too long" if max(len(wa), len(wb)) > max_words
                  else "length ratio" if max(len(wa), len(wb)) > max_ratio * min(len(wa), len(wb))
                  else "copy" if copies and wa == wb
                  else "duplicate" if dedup and (tuple(wa), tuple(wb)) in seen else None)
        if reason:
            counts[reason] += 1
        else:
            seen.add((tuple(wa), tuple(wb)))
            kept.append((a, b))
    return kept, counts


def write(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def read(path):
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("rules", [CleanRules(), CleanRules(max_words=12, max_ratio=1.5),
                                   CleanRules(dedup=False, copies=False)])
def test_each_rule_drops_what_the_plain_filter_drops_and_keeps_the_rest_in_order(tmp_path, rules):
    pairs = faulty(real_pairs())
    write(tmp_path / "in.en.gz", [a for a, _ in pairs], gz=True)
    write(tmp_path / "in.de", [b for _, b in pairs])
    report = clean_files(tmp_path / "in.en.gz", tmp_path / "in.de", tmp_path / "out.en", tmp_path / "out.de", rules)
    kept, counts = plain(pairs, rules.max_words, rules.max_ratio, rules.dedup, rules.copies)
    assert list(zip(read(tmp_path / "out.en"), read(tmp_path / "out.de"))) == kept
    assert report.dropped == counts and report.read == len(pairs) and report.kept == len(kept)
    assert sum(counts.values()) >= 40  # the faults are there to be found
    again = clean_files(tmp_path / "out.en", tmp_path / "out.de", tmp_path / "2.en", tmp_path / "2.de", rules)
    assert again.kept == again.read == len(kept)  # cleaning twice drops nothing more


def test_language_identification_drops_swapped_and_untranslated_pairs_only(tmp_path):
    pairs = real_pairs(200)
    bad = [(b, a) for a, b in pairs[:5]] + [(a, "Das ist " + a) for a, _ in pairs[5:10]]  # swapped, untranslated
    mixed = pairs[10:] + bad
    write(tmp_path / "a.en", [a for a, _ in mixed])
    write(tmp_path / "a.de", [b for _, b in mixed])
    report = clean_files(tmp_path / "a.en", tmp_path / "a.de", tmp_path / "o.en", tmp_path / "o.de",
                         CleanRules(languages=("en", "de")))
    assert report.dropped["language"] == 10 and report.kept == 190
    assert read(tmp_path / "o.en") == [a for a, _ in pairs[10:]]
    with pytest.raises(ConfigError, match="knows no 'xx'"):
        clean_files(tmp_path / "a.en", tmp_path / "a.de", tmp_path / "o.en", tmp_path / "o.de",
                    CleanRules(languages=("en", "xx")))


def test_bad_input_names_the_file_and_line_and_leaves_the_outputs_as_they_were(tmp_path):
    write(tmp_path / "a.en", ["one", "two", "three"])
    write(tmp_path / "a.de", ["eins", "zwei"])
    write(tmp_path / "o.en", ["before"])
    with pytest.raises(DataError, match=r"a.de ends at line 2 but .*a.en goes on"):
        clean_files(tmp_path / "a.en", tmp_path / "a.de", tmp_path / "o.en", tmp_path / "o.de")
    assert read(tmp_path / "o.en") == ["before"] and not (tmp_path / "o.de").exists()
    (tmp_path / "b.de").write_bytes(b"eins\nzw\xffei\ndrei\n")
    with pytest.raises(DataError, match="line 2"):
        clean_files(tmp_path / "a.en", tmp_path / "b.de", tmp_path / "o.en", tmp_path / "o.de")
    with pytest.raises(ConfigError, match="must not be the inputs"):
        clean_files(tmp_path / "a.en", tmp_path / "a.de", tmp_path / "a.en", tmp_path / "o.de")
    for bad in (dict(max_words=0), dict(max_ratio=0.5)):
        with pytest.raises(ConfigError):
            CleanRules(**bad)


def test_the_command_writes_the_cleaned_files_and_its_counts(tmp_path):
    pairs = faulty(real_pairs(40))
    write(tmp_path / "train.en.gz", [a for a, _ in pairs], gz=True)
    write(tmp_path / "train.de.gz", [b for _, b in pairs], gz=True)
    r = subprocess.run([sys.executable, "-m", "tformer", "data", "clean", "--src", str(tmp_path / "train.en.gz"),
                        "--tgt", str(tmp_path / "train.de.gz"), "--out", str(tmp_path / "clean"), "--langid", "en",
                        "de"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    kept, counts = plain(pairs)
    swapped = {(b, a) for i, (a, b) in enumerate(real_pairs(40)) if i % 8 == 6}
    want, _ = plain([p for p in pairs if p not in swapped])  # what language identification leaves
    report = json.loads((tmp_path / "clean" / "clean.json").read_text())
    assert list(zip(read(tmp_path / "clean" / "train.en"), read(tmp_path / "clean" / "train.de"))) == want
    assert report["read"] == len(pairs) and report["kept"] == len(want)
    assert {k: v for k, v in report["dropped"].items() if k != "language"} == {k: v for k, v in counts.items()
                                                                              if k != "language"}
    assert report["dropped"]["language"] == sum(1 for i in range(40) if i % 8 == 6)  # the swapped pairs
    assert f"kept {report['kept']} of {len(pairs)} pairs" in r.stdout
