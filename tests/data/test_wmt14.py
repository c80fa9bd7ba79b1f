"""WMT14 en-de: the download (small synthetic archives with the upstream member names, served from a loopback
HTTP server, the checksum table injected) and compound-split tokenized BLEU. No test reaches the internet."""

import functools
import gzip
import hashlib
import http.server
import io
import json
import shutil
import subprocess
import tarfile
import threading

import pytest

from helpers.oracles import bleu_by_definition
from tformer.cli import main
from tformer.data import download
from tformer.data.download import (WMT14_ARCHIVES, WMT14_LAYOUT, Archive, download_wmt14, sgml_segments,
                                   unescape_xml)
from tformer.errors import DataError
from tformer.metrics import moses_tokenize, split_compounds, translation_scores

pytestmark = pytest.mark.slow  # integration runs of whole commands: `pytest -m "not slow"` skips them

# --------------------------------------------------------------------------- synthetic archives

EUROPARL = (["Resumption of the session", "I declare resumed the session.", "Thank you, Mr Segni."],
            ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre die Sitzung für wiederaufgenommen.",
             "Vielen Dank, Herr Segni."])
CRAWL = (["Hotel near the station", "Tab\tinside, and a trailing space "],
         ["Hotel in Bahnhofsnähe", "Tab\tinnen, und ein Leerzeichen am Ende "])
NEWS = (["The Kraft-Wärme-Kopplung debate.", "Growth is slow."],
        ["Die Debatte über Kraft-Wärme-Kopplung.", "Das Wachstum ist langsam."])
DEV = (["A Republican strategy", "Second line"], ["Eine republikanische Strategie", "Zweite Zeile"])
# (SGML line, its text as sacreBLEU extracts it, then with the XML entities unescaped)
TEST_EN = [('<seg id="1">Gutach: Increased safety for pedestrians</seg>', "Gutach: Increased safety for pedestrians"),
           ('<seg id="2">  Standard &amp; Poor&apos;s  said &quot;no&quot;\t</seg>', "Standard & Poor's said \"no\""),
           ('<seg id="3">AT&T and R&D stay; &nbsp; too; &#x41;&#66;</seg>', "AT&T and R&D stay; &nbsp; too; AB")]
TEST_DE = [('<seg id="1">Gutach: Noch mehr Sicherheit für Fußgänger</seg>',
            "Gutach: Noch mehr Sicherheit für Fußgänger"),
           ('<seg id="2">Standard &amp; Poor&apos;s sagte &quot;nein&quot;</seg>', 'Standard & Poor\'s sagte "nein"'),
           ('<seg id="3">&lt;b&gt; bleibt Text</seg>', "<b> bleibt Text")]


def _sgml(segments, lang):
    body = "\n".join(line for line, _ in segments)
    return (f'<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1" genre="news" origlang="{lang}">'
            f"\n<p>\n{body}\n</p>\n</doc>\n</srcset>\n")


def _text(lines, final_newline=True):
    return "\n".join(lines) + ("\n" if final_newline else "")


def _tgz(path, members):
    """A .tgz holding `members` ({name: text}) in the order given."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def build_archives(root, news=NEWS):
    """The five archives under their upstream names, with decoy members (other language pairs) around the
    wanted ones, the German member before the English one in some, and a member without a final newline."""
    root.mkdir(parents=True, exist_ok=True)
    _tgz(root / "de-en.tgz", {"europarl-v7.de-en.de": _text(EUROPARL[1]),
                              "europarl-v7.de-en.en": _text(EUROPARL[0], final_newline=False)})
    _tgz(root / "training-parallel-commoncrawl.tgz",
         {"commoncrawl.fr-en.en": "decoy\n", "commoncrawl.de-en.en": _text(CRAWL[0]),
          "commoncrawl.de-en.annotation": "x\ny\n", "commoncrawl.de-en.de": _text(CRAWL[1]),
          "commoncrawl.ru-en.en": "decoy\n"})
    _tgz(root / "training-parallel-nc-v9.tgz",
         {"training/news-commentary-v9.cs-en.en": "decoy\n", "training/news-commentary-v9.de-en.de": _text(news[1]),
          "training/news-commentary-v9.de-en.en": _text(news[0])})
    _tgz(root / "dev.tgz", {"dev/newstest2012.en": "decoy\n", "dev/newstest2013.en": _text(DEV[0]),
                            "dev/newstest2013.de": _text(DEV[1])})
    _tgz(root / "test-full.tgz", {"test-full/newstest2014-deen-src.de.sgm": _sgml(TEST_DE, "de"),
                                  "test-full/newstest2014-deen-src.en.sgm": _sgml(TEST_EN, "en"),
                                  "test-full/newstest2014-deen-ref.de.sgm": _sgml(TEST_DE, "de")})


def table_for(root):
    """The official table with each digest replaced by the fake archive's, in the same algorithm."""
    return [Archive(a.url, a.algorithm, hashlib.new(a.algorithm, (root / a.name).read_bytes()).hexdigest())
            for a in WMT14_ARCHIVES]


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files; counts every GET and, when `ranges`, honours `Range: bytes=N-`."""

    hits: list
    ranges = False

    def log_message(self, *args):
        pass

    def do_GET(self):
        rng = self.headers.get("Range")
        self.hits.append((self.path, rng))
        if not (self.ranges and rng):
            return super().do_GET()
        data = open(self.translate_path(self.path), "rb").read()
        start = int(rng.removeprefix("bytes=").rstrip("-"))
        if start >= len(data):
            return self.send_error(416)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])


@pytest.fixture
def server(tmp_path):
    """(folder served, base URL, list of (path, Range header) per GET, handler class)."""
    root = tmp_path / "www"
    build_archives(root)
    hits = []
    handler = type("Handler", (_Handler,), {"hits": hits})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{srv.server_address[1]}", hits, handler
    srv.shutdown()
    srv.server_close()


def _lines(path):
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _corpus_files(out):
    return sorted(p.name for p in out.iterdir() if p.suffix in (".en", ".de"))


# --------------------------------------------------------------------------- the download


def test_official_table_names_the_five_archives():
    urls = {a.url for a in WMT14_ARCHIVES}
    assert urls == {"http://www.statmt.org/europarl/v7/de-en.tgz",
                    "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                    "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
                    "http://www.statmt.org/wmt14/dev.tgz", "http://www.statmt.org/wmt14/test-full.tgz"}
    for a in WMT14_ARCHIVES:
        assert len(a.digest) == 2 * hashlib.new(a.algorithm).digest_size, a
        int(a.digest, 16)  # hexadecimal
    assert {p.archive for pairs in WMT14_LAYOUT.values() for p in pairs} == {a.name for a in WMT14_ARCHIVES}


def test_download_writes_the_corpus_in_order(server, tmp_path, monkeypatch, capsys):
    root, url, hits, _ = server
    monkeypatch.setattr(download, "WMT14_ARCHIVES", table_for(root))
    out = tmp_path / "wmt14"
    assert main(["data", "wmt14", "--out", str(out), "--url", url]) == 0
    # the oracle: the lines put into the archives, Europarl, Common Crawl, News Commentary in this order
    assert _lines(out / "train.en") == EUROPARL[0] + CRAWL[0] + NEWS[0]
    assert _lines(out / "train.de") == EUROPARL[1] + CRAWL[1] + NEWS[1]
    assert _lines(out / "newstest2013.en") == DEV[0] and _lines(out / "newstest2013.de") == DEV[1]
    assert _lines(out / "newstest2014.en") == [text for _, text in TEST_EN]
    assert _lines(out / "newstest2014.de") == [text for _, text in TEST_DE]
    assert sorted(p for p, _ in hits) == sorted(f"/{a.name}" for a in WMT14_ARCHIVES)  # each once
    stdout = capsys.readouterr().out
    assert f"{out / 'train.en'}: 7 lines" in stdout and f"{out / 'newstest2014.de'}: 3 lines" in stdout
    assert f"tformer prepare --config wmt14_en_de data.dir={out} --out {out}/prepared" in stdout
    assert f"tformer train --config wmt14_en_de data.dir={out} data.prepared={out}/prepared" in stdout
    assert not [p for p in out.iterdir() if "part" in p.name]
    for a in WMT14_ARCHIVES:  # archives kept, byte-identical
        assert (out / a.name).read_bytes() == (root / a.name).read_bytes()


def test_rerun_downloads_nothing_and_redoes_only_what_is_missing(server, tmp_path):
    root, url, hits, _ = server
    table, out = table_for(root), tmp_path / "wmt14"
    download_wmt14(out, url, table, progress=False)
    n, before = len(hits), {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".en", ".de")}
    again = download_wmt14(out, url, table, progress=False)
    assert len(hits) == n and all(f.lines is None for f in again)
    (out / "newstest2013.de").unlink()  # as if a run died between the two renames
    redo = download_wmt14(out, url, table, progress=False)
    assert len(hits) == n  # the archives are there with the right checksum
    assert {f.path.name: f.lines for f in redo if f.lines is not None} == {"newstest2013.en": 2, "newstest2013.de": 2}
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".en", ".de")} == before
    # with every output there, even deleted archives are not fetched again
    for a in WMT14_ARCHIVES:
        (out / a.name).unlink()
    download_wmt14(out, url, table, progress=False)
    assert len(hits) == n


def test_checksum_mismatch_names_url_and_both_digests_and_writes_nothing(server, tmp_path):
    root, url, hits, _ = server
    table = table_for(root)
    wrong = hashlib.md5(b"another file").hexdigest()
    table = [Archive(a.url, a.algorithm, wrong) if a.name == "test-full.tgz" else a for a in table]
    actual = hashlib.md5((root / "test-full.tgz").read_bytes()).hexdigest()
    out = tmp_path / "wmt14"
    with pytest.raises(DataError) as e:
        download_wmt14(out, url, table, progress=False)
    msg = str(e.value)
    assert f"{url}/test-full.tgz" in msg and wrong in msg and actual in msg and "is not the expected" in msg
    assert _corpus_files(out) == []  # every archive is checked before anything is extracted
    assert not (out / "test-full.tgz").exists() and not list(out.glob("*.part"))
    # the next run, with the right table, downloads only what is missing
    n = len(hits)
    download_wmt14(out, url, table_for(root), progress=False)
    assert [p for p, _ in hits[n:]] == ["/test-full.tgz"]


def test_archive_already_there_but_damaged_is_fetched_again(server, tmp_path):
    root, url, hits, _ = server
    out = tmp_path / "wmt14"
    out.mkdir()
    (out / "dev.tgz").write_bytes(b"truncated")
    download_wmt14(out, url, table_for(root), progress=False)
    assert (out / "dev.tgz").read_bytes() == (root / "dev.tgz").read_bytes()
    assert _lines(out / "newstest2013.de") == DEV[1]


def test_misaligned_member_is_refused_by_name(server, tmp_path):
    root, url, _, _ = server
    build_archives(root, news=(NEWS[0] + ["one line too many"], NEWS[1]))
    out = tmp_path / "wmt14"
    with pytest.raises(DataError, match=r"training/news-commentary-v9\.de-en\.en has 3 lines but "
                                        r"training/news-commentary-v9\.de-en\.de has 2"):
        download_wmt14(out, url, table_for(root), progress=False)
    assert not (out / "train.en").exists() and not (out / "train.de").exists()
    assert not [p for p in out.iterdir() if "part" in p.name]


def test_missing_member_is_named(server, tmp_path):
    root, url, _, _ = server
    _tgz(root / "dev.tgz", {"dev/newstest2013.en": _text(DEV[0])})
    with pytest.raises(DataError, match=r"dev\.tgz has no member dev/newstest2013\.de"):
        download_wmt14(tmp_path / "wmt14", url, table_for(root), progress=False)


def test_server_404_gives_a_clear_message(server, tmp_path, monkeypatch, capsys):
    root, url, _, _ = server
    monkeypatch.setattr(download, "WMT14_ARCHIVES", table_for(root))
    (root / "training-parallel-nc-v9.tgz").unlink()
    code = main(["data", "wmt14", "--out", str(tmp_path / "wmt14"), "--url", url])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{url}/training-parallel-nc-v9.tgz: the server answered 404" in err
    assert "upstream names" in err and "test-full.tgz" in err
    assert not list((tmp_path / "wmt14").glob("*.part"))


@pytest.mark.parametrize("ranges", [True, False])
def test_interrupted_download_resumes_or_restarts(server, tmp_path, ranges):
    root, url, hits, handler = server
    handler.ranges = ranges
    out = tmp_path / "wmt14"
    out.mkdir()
    whole = (root / "training-parallel-commoncrawl.tgz").read_bytes()
    (out / "training-parallel-commoncrawl.tgz.part").write_bytes(whole[: len(whole) // 2])
    download_wmt14(out, url, table_for(root), progress=False)
    assert ("/training-parallel-commoncrawl.tgz", f"bytes={len(whole) // 2}-") in hits
    assert (out / "training-parallel-commoncrawl.tgz").read_bytes() == whole
    assert _lines(out / "train.en") == EUROPARL[0] + CRAWL[0] + NEWS[0]


def test_damaged_partial_download_is_deleted_so_the_next_run_starts_afresh(server, tmp_path):
    root, url, hits, handler = server
    handler.ranges = True
    out = tmp_path / "wmt14"
    out.mkdir()
    part = out / "dev.tgz.part"
    part.write_bytes(b"garbage, not the start of dev.tgz")
    with pytest.raises(DataError, match="dev.tgz: md5 .* is not the expected"):
        download_wmt14(out, url, table_for(root), progress=False)
    assert not part.exists()
    download_wmt14(out, url, table_for(root), progress=False)
    assert _lines(out / "newstest2013.en") == DEV[0]


def test_offline_gives_a_clear_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    with pytest.raises(DataError, match="cannot download .*de-en.tgz.*are you offline"):
        download_wmt14(tmp_path / "w", f"http://127.0.0.1:{port}", progress=False)


def test_a_second_run_into_the_same_folder_is_refused(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "wmt14"
    out.mkdir()
    with open(out / ".download.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a first run holds it
        with pytest.raises(DataError, match="another `tformer data` is downloading into this folder"):
            download_wmt14(out, "http://127.0.0.1:9", progress=False)


# --------------------------------------------------------------------------- SGML


def test_sgml_segments_extracts_in_order_and_unescapes_xml_entities():
    lines = _sgml(TEST_EN, "en").splitlines(keepends=True)
    assert list(sgml_segments(lines)) == [text for _, text in TEST_EN]
    assert unescape_xml("&amp;lt; &#60; &#1114112; &foo; & ;") == "&lt; < &#1114112; &foo; & ;"  # one level only


def test_sgml_of_real_newstest_round_trips(shared_data, tmp_path):
    from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

    """The real newstest2014 sentences (sacreBLEU's text of wmt14/full), wrapped as WMT wraps them (a bare `&`
    as in the upstream files), come back unchanged, as sacreBLEU's own extraction gives them."""
    for lang in ("en", "de"):
        with gzip.open(shared_data / "wmt14" / f"newstest2014.{lang}.gz", "rt", encoding="utf-8") as f:
            sentences = f.read().split("\n")[:-1]
        sgml = _sgml([(f'<seg id="{i}">{s}</seg>', s) for i, s in enumerate(sentences, 1)], lang)
        assert list(sgml_segments(sgml.splitlines(keepends=True))) == sentences
        convert = getattr(FakeSGMLDataset, "_convert_format", None)  # sacreBLEU's (internal) SGML-to-text step
        if convert is not None:
            (tmp_path / "in.sgm").write_text(sgml, encoding="utf-8")
            convert(FakeSGMLDataset, str(tmp_path / "in.sgm"), str(tmp_path / "out.txt"))
            assert (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1] == sentences


# --------------------------------------------------------------------------- compound splitting

COMPOUND_CASES = {  # worked out by hand from perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g
    "Kraft-Wärme-Kopplung": "Kraft ##AT##-##AT## Wärme ##AT##-##AT## Kopplung",
    "a-b-c": "a ##AT##-##AT## b-c",  # `b` is consumed by the first match: the second hyphen has no $1 left
    "a-b-c-d": "a ##AT##-##AT## b-c ##AT##-##AT## d",
    "a--b": "a ##AT##-##AT## -b",  # $2 is the second hyphen
    "a---b": "a ##AT##-##AT## --b",
    "- a - b -": "- a - b -",  # a hyphen next to a space is left alone
    "-x x-": "-x x-",
    "US-Präsident und E-Mail": "US ##AT##-##AT## Präsident und E ##AT##-##AT## Mail",
    "1990-2000": "1990 ##AT##-##AT## 2000",
    "a\u00a0-b": "a\u00a0 ##AT##-##AT## b",  # perl works on bytes: a no-break space is not \s there
    # on bytes, $2 is the first byte of a two-byte character and the search resumes inside it: a one-letter
    # middle that is not ASCII does not shield the next hyphen
    "ä-ö-ü-ß": "ä ##AT##-##AT## ö ##AT##-##AT## ü ##AT##-##AT## ß",
    "a-ö-c": "a ##AT##-##AT## ö ##AT##-##AT## c",
    "ö-a-c": "ö ##AT##-##AT## a-c",
    "": "",
}


def test_split_compounds_cases():
    for line, expected in COMPOUND_CASES.items():
        assert split_compounds(line) == expected, line


def test_split_compounds_agrees_with_perl(shared_data):
    perl = shutil.which("perl")
    if perl is None:
        pytest.skip("perl is not installed: the hand-worked cases above still ran")
    with gzip.open(shared_data / "wmt14" / "newstest2014.de.gz", "rt", encoding="utf-8") as f:
        real = [line.rstrip("\n") for line in f][:600]
    lines = list(COMPOUND_CASES) + real + moses_tokenize(real[:200], "de") + ["x\t-y", "x-\ty", "ä-ö-ü-ß"]
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    got = subprocess.run([perl, "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=data, capture_output=True,
                         check=True).stdout.decode("utf-8").split("\n")[:-1]
    assert [split_compounds(line) for line in lines] == got
    assert sum("##AT##" in line for line in got) > 20  # the real text did exercise it


def test_compound_split_bleu_only_when_asked():
    refs = ["Die Kraft-Wärme-Kopplung ist eine alte Idee , sagte der US-Präsident am Montag .",
            "Das Wachstum der Euro-Zone bleibt schwach , und die E-Mail kam spät an ."]
    hyps = ["Die Kraft-Wärme ist eine alte Idee , sagte der US-Präsident am Montag .",
            "Das Wachstum der Euro-Region bleibt schwach , und die E-Mail kam spät an ."]
    plain = translation_scores(hyps, refs, "de")
    assert plain.tok_bleu_compound is None and "tok_bleu_compound" not in plain.as_dict()
    s = translation_scores(hyps, refs, "de", compound_split=True)
    split = lambda lines: [split_compounds(x) for x in moses_tokenize(lines, "de")]  # noqa: E731
    assert s.tok_bleu_compound == pytest.approx(bleu_by_definition(split(hyps), split(refs)), abs=1e-6)
    assert s.tok_bleu_compound > s.tok_bleu  # half-right compounds earn partial credit once split
    assert (s.bleu, s.chrf, s.tok_bleu) == (plain.bleu, plain.chrf, plain.tok_bleu)  # the others unchanged
    assert s.as_dict()["tok_bleu_compound"] == s.tok_bleu_compound
    assert s.tok_bleu_compound_signature.endswith("|moses:de|compound:##AT##")


# --------------------------------------------------------------------------- the recipe, end to end on a CPU


def test_the_wmt14_recipe_runs_end_to_end_on_a_cpu(shared_data, tmp_path):
    """The recipe as the README gives it (Transformer-base, shared SentencePiece, inverse-sqrt, accumulation,
    averaging), on real newstest text laid out as `tformer data wmt14` writes it: prepare, a few updates,
    average, evaluate with the compound-split BLEU. Smaller batches, sentences, vocabulary and outputs only."""
    import sys
    from pathlib import Path

    data = tmp_path / "wmt14"
    data.mkdir()
    for lang in ("en", "de"):
        with gzip.open(shared_data / "wmt14" / f"newstest2013.{lang}.gz", "rt", encoding="utf-8") as f:
            dev = f.read().splitlines(keepends=True)
        with gzip.open(shared_data / "wmt14" / f"newstest2014.{lang}.gz", "rt", encoding="utf-8") as f:
            test = f.read().splitlines(keepends=True)
        (data / f"train.{lang}").write_text("".join(dev[:2000]), encoding="utf-8")
        (data / f"newstest2013.{lang}").write_text("".join(dev[2000:2030]), encoding="utf-8")
        (data / f"newstest2014.{lang}").write_text("".join(test[:30]), encoding="utf-8")
    root = Path(__file__).resolve().parents[2]

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "tformer", *map(str, args), "--no-progress"], capture_output=True,
                           text=True, timeout=600, cwd=root)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    out = cli("prepare", "--config", "wmt14_en_de", f"data.dir={data}", "data.vocab_size=1000",
              "data.filter_max_len=60", "--out", data / "prepared")
    assert "learned from 2,000 of 2,000 training pairs" in out
    run = tmp_path / "run"
    cli("train", "--config", "wmt14_en_de", f"data.dir={data}", f"data.prepared={data / 'prepared'}",
        "train.max_steps=2", "train.max_tokens=250", "train.eval_every=2", "train.save_every=1", "train.keep_last=2",
        "train.threads=2", "decode.max_len_a=0", "decode.max_len_b=3", "--run-dir", run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1]  # step 1 is always logged
    assert [r["step"] for r in records if r["kind"] == "valid"] == [2]
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["model"]["d_model"], cfg["model"]["encoder_layers"], cfg["train"]["accum_steps"]) == (512, 6, 4)
    subprocess.run([sys.executable, "-m", "tformer", "average", "--run-dir", run, "--last", "2", "--out",
                    tmp_path / "avg"], check=True, capture_output=True, timeout=300, cwd=root)
    out = subprocess.run([sys.executable, "-m", "tformer", "evaluate", "--checkpoint", tmp_path / "avg", "--split",
                          "test", "--beam", "4", "decode.max_len_a=0", "decode.max_len_b=3"], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sacreBLEU" in out.stdout and "compounds split" in out.stdout and "|compound:##AT##" in out.stdout
