"""Raw corpora: aligned files and TSV, gzip, UTF-8 errors with file and line, normalisation, the seeded
split, filtering, and the Multi30k download against a loopback HTTP server."""

import functools
import gzip
import http.server
import shutil
import threading
import unicodedata

import pytest

from tformer.cli import main
from tformer.data.corpus import filter_pairs, normalize, read_aligned, read_lines, read_tsv, split_corpus
from tformer.data.download import MULTI30K_FILES, download_multi30k


def test_normalize_nfc_and_no_break_spaces():
    decomposed = "Cafe\u0301 ou the\u0301 ?"  # e + combining acute
    assert normalize(decomposed) == unicodedata.normalize("NFC", "Café ou thé ?")
    assert normalize("Va\u202f!  Je\u00a0t'aime\u00a0!\t ") == "Va ! Je t'aime !"
    assert normalize("\ufeffHi") == "Hi"


def test_read_lines_plain_and_gzip_alike(tmp_path):
    text = "première ligne\r\nsecond\n"
    (tmp_path / "a.txt").write_bytes(text.encode("utf-8"))
    (tmp_path / "a.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    (tmp_path / "b.txt").write_bytes(gzip.compress(text.encode("utf-8")))  # gzip without the suffix
    expected = ["première ligne", "second"]
    assert read_lines(tmp_path / "a.txt") == read_lines(tmp_path / "a.gz") == read_lines(tmp_path / "b.txt") == expected


def test_invalid_utf8_names_file_and_line(tmp_path):
    (tmp_path / "x.de").write_bytes("gut\nsch\xf6n\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"x\.de, line 2, byte 4 of the line: not valid UTF-8.*iconv"):
        read_lines(tmp_path / "x.de")
    (tmp_path / "y.gz").write_bytes(gzip.compress("ok\nok\n\xe9t\xe9\n".encode("latin-1")))
    with pytest.raises(ValueError, match=r"y\.gz, line 3"):
        read_lines(tmp_path / "y.gz")
    (tmp_path / "z.gz").write_bytes(gzip.compress(b"a\n" * 1000)[:30])
    with pytest.raises(ValueError, match="cannot be decompressed"):
        read_lines(tmp_path / "z.gz")


def test_misaligned_files_report_the_first_disagreeing_line(tmp_path):
    (tmp_path / "t.en").write_text("a\nb\nc\n")
    (tmp_path / "t.de").write_text("A\nB\n")
    with pytest.raises(ValueError, match=r"t\.en has 3 lines but .*t\.de has 2: the files disagree from line 3, "
                                         r"which exists in .*t\.en"):
        read_aligned(tmp_path / "t.en", tmp_path / "t.de")


def test_tsv_columns_and_short_lines(tmp_path):
    (tmp_path / "fra.txt").write_text("Go.\tVa\u202f!\tCC-BY attribution\nHi.\tSalut !\n")
    c = read_tsv(tmp_path / "fra.txt")
    assert (c.src, c.tgt) == (["Go.", "Hi."], ["Va !", "Salut !"])
    rev = read_tsv(tmp_path / "fra.txt", 1, 0)
    assert rev.src == ["Va !", "Salut !"]
    (tmp_path / "bad.txt").write_text("Go.\tVa !\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 2: 1 tab-separated field"):
        read_tsv(tmp_path / "bad.txt")


def test_real_corpora_read_aligned(shared_data):
    c = read_aligned(shared_data / "multi30k" / "val.en.gz", shared_data / "multi30k" / "val.de.gz")
    assert len(c) == 1014
    fra = read_tsv(shared_data / "fra-eng" / "fra.txt.gz")
    assert len(fra) == 167130 and (fra.src[0], fra.tgt[0]) == ("Go.", "Va !")
    assert not any("\u202f" in t or "\u00a0" in t for t in fra.tgt)  # 10k lines had them raw


def test_split_is_seeded_stable_and_groups_sources():
    src = [f"s{i % 50}" for i in range(200)]  # every source 4 times, with different targets
    from tformer.data.corpus import Corpus

    corpus = Corpus(src, [f"t{i}" for i in range(200)], "mem", list(range(1, 201)))
    a = split_corpus(corpus, valid_size=20, test_size=20, seed=3)
    b = split_corpus(corpus, valid_size=20, test_size=20, seed=3)
    assert {k: v.tgt for k, v in a.items()} == {k: v.tgt for k, v in b.items()}
    assert sum(len(v) for v in a.values()) == 200
    assert len(a["test"]) == 20 and len(a["valid"]) == 20  # groups of 4 fill 20 exactly
    assert not set(a["test"].src) & set(a["train"].src) and not set(a["valid"].src) & set(a["train"].src)
    assert {k: v.tgt for k, v in split_corpus(corpus, 20, 20, seed=4).items()} != {k: v.tgt for k, v in a.items()}
    # the split of a sentence depends on the sentence and the seed, not on the rest of the file
    bigger = Corpus(src + ["new"], [f"t{i}" for i in range(201)], "mem", list(range(1, 202)))
    c = split_corpus(bigger, 20, 20, seed=3)
    assert set(c["test"].src) <= set(a["test"].src) | {"new"}


def test_filter_counts_reasons():
    keep, report = filter_pairs([0, 3, 300, 4, 10], [2, 3, 5, 40, 11], max_len=250, max_ratio=3.0)
    assert keep == [1, 4]
    assert report.dropped == {"with an empty side": 1, "longer than 250 tokens": 1,
                              "with a length ratio above 3": 1}
    assert "kept 2 of 5 training pairs" in str(report)


# --------------------------------------------------------------------------- download


@pytest.fixture
def loopback_server(tmp_path, shared_data):
    """Serve the Multi30k files under their upstream names from 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    for remote, (local, _) in MULTI30K_FILES.items():
        shutil.copy(shared_data / "multi30k" / local, root / remote)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_multi30k_from_loopback(loopback_server, tmp_path, capsys):
    root, url = loopback_server
    out = tmp_path / "m30k"
    assert main(["data", "multi30k", "--out", str(out), "--url", url]) == 0
    for remote, (local, _) in MULTI30K_FILES.items():
        assert (out / local).read_bytes() == (root / remote).read_bytes()
    assert "data.dir=" in capsys.readouterr().out
    # a damaged file upstream is refused and nothing is written for it
    (root / "val.de.gz").write_bytes(b"not the file")
    (out / "val.de.gz").unlink()
    with pytest.raises(ValueError, match=r"val\.de\.gz: SHA-256 .* is not the expected"):
        download_multi30k(out, url)
    assert not (out / "val.de.gz").exists() and not list(out.glob(".*part*"))


def test_download_offline_gives_a_clear_error(tmp_path, capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    code = main(["data", "multi30k", "--out", str(tmp_path / "m"), "--url", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot download" in err and "are you offline?" in err
