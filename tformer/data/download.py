"""`tformer data multi30k --out DIR`: fetch the official Multi30k task-1 files, check each one against its
SHA-256, and write it atomically. Nothing here runs in the tests' normal path: they point it at a local
HTTP server on loopback."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

from tformer.errors import DataError

log = logging.getLogger("tformer")

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"

# upstream name -> (local name, SHA-256 of the upstream .gz bytes; github.com/multi30k/dataset, data files
# last changed in commit c9be912 of 2018-01-17)
MULTI30K_FILES = {
    "train.en.gz": ("train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
    "train.de.gz": ("train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
    "val.en.gz": ("val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
    "val.de.gz": ("val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
    "test_2016_flickr.en.gz": ("test2016.en.gz", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    "test_2016_flickr.de.gz": ("test2016.de.gz", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(url: str, timeout: float = 30.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise DataError(f"{url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"cannot download {url} ({reason}); are you offline? Fetch the files by hand "
                        f"(they are listed in tformer/data/download.py) and point data.dir at them") from None


def download_multi30k(out: str | Path, base_url: str = MULTI30K_URL) -> list[Path]:
    """Every Multi30k task-1 en/de file into `out`, named as the recipe expects (train, val, test2016).
    Files already there with the right checksum are kept; a download with the wrong checksum is refused."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for remote, (local, sha) in MULTI30K_FILES.items():
        path = out / local
        if path.exists() and _sha256(path.read_bytes()) == sha:
            log.info("%s: already there, checksum ok", path)
            written.append(path)
            continue
        url = f"{base_url.rstrip('/')}/{remote}"
        data = fetch(url)
        got = _sha256(data)
        if got != sha:
            raise DataError(f"{url}: SHA-256 {got} is not the expected {sha}; the download is damaged or the "
                            "file changed upstream; nothing was written for it")
        tmp = path.with_name(f".{local}.part-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        log.info("%s: %d bytes, checksum ok", path, len(data))
        written.append(path)
    return written
