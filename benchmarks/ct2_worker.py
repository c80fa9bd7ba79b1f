"""CTranslate2 in a process of its own, for benchmarks that set it beside tformer.

CTranslate2's wheel brings its own copy of the OpenMP runtime. In one process with PyTorch's, after
CTranslate2's first `translate_batch` the PyTorch ops that open parallel regions (bmm, SDPA, softmax) ran
7-20x slower on a 2-core AMD EPYC, and a whole tformer decoding step 1.3-1.8x slower, for the rest of the
process (benchmarks/RESULTS.md, "CTranslate2 in the same process slows PyTorch down"). So a benchmark that
takes turns between the engines keeps CTranslate2 in this worker and times each call here, in the worker.

    worker = CT2Worker({"ct2-fp32": DIR, "ct2-int8": DIR8}, threads=2)
    hypotheses, seconds = worker.translate("ct2-fp32", pieces, beam=4, max_len=24, batch_size=32)
    worker.close()
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


class CT2Worker:
    """A child process holding one `ctranslate2.Translator` per engine name (CPU, `threads` intra threads, one
    inter thread), answering translate requests over a pipe, one JSON line each way."""

    def __init__(self, models: dict[str, str], threads: int) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, json.dumps({"models": models, "threads": threads})],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()  # ready: the models are loaded

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the CTranslate2 worker exited (code {self.process.wait()})")
        return json.loads(line)

    def translate(self, engine: str, pieces: list[list[str]], beam: int, max_len: int, batch_size: int
                  ) -> tuple[list[list[str]], float]:
        """The best hypothesis of each source (pieces) and the seconds `translate_batch` took in the worker."""
        request = dict(engine=engine, pieces=pieces, beam=beam, max_len=max_len, batch_size=batch_size)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        return answer["hypotheses"], answer["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def serve(spec: dict) -> None:
    import ctranslate2

    models = {name: ctranslate2.Translator(path, device="cpu", intra_threads=spec["threads"], inter_threads=1)
              for name, path in spec["models"].items()}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        r = json.loads(line)
        tic = time.perf_counter()
        res = models[r["engine"]].translate_batch(r["pieces"], max_batch_size=r["batch_size"], beam_size=r["beam"],
                                                  length_penalty=0.0, max_decoding_length=r["max_len"],
                                                  min_decoding_length=0)
        seconds = time.perf_counter() - tic
        print(json.dumps({"hypotheses": [x.hypotheses[0] for x in res], "seconds": seconds}), flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
