"""CTranslate2 in a process of its own, for benchmarks that set it beside tformer.

CTranslate2's wheel brings its own copy of the OpenMP runtime, and each Translator its own thread team. On a
2-core AMD EPYC (benchmarks/RESULTS.md, "Engines sharing a process slow each other down"):
- in one process with PyTorch, after CTranslate2's first `translate_batch`, the PyTorch ops that open parallel
  regions (bmm, SDPA, softmax) ran 7-20x slower and a whole tformer decoding step 1.3-1.8x slower, for the
  rest of the process;
- two Translators in one process (fp32 and int8, 2 threads each) ran CTranslate2 fp32 2.5x slower than one.
So a benchmark that takes turns between engines runs each CTranslate2 model in a worker process of its own,
and times each call there.

    worker = CT2Worker(MODEL_DIR, threads=2)
    hypotheses, seconds = worker.translate(pieces, beam=4, max_len=24, batch_size=32)
    worker.close()
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


class CT2Worker:
    """A child process holding one `ctranslate2.Translator` (CPU, `threads` intra threads, one inter thread),
    answering translate requests over a pipe, one JSON line each way."""

    def __init__(self, model: str, threads: int) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, json.dumps({"model": model, "threads": threads})],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()  # ready: the models are loaded

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the CTranslate2 worker exited (code {self.process.wait()})")
        return json.loads(line)

    def translate(self, pieces: list[list[str]], beam: int, max_len: int, batch_size: int, use_vmap: bool = False
                  ) -> tuple[list[list[str]], float]:
        """The best hypothesis of each source (pieces) and the seconds `translate_batch` took in the worker.
        use_vmap: restrict the output to the model's vocabulary map (a model exported with one)."""
        request = dict(pieces=pieces, beam=beam, max_len=max_len, batch_size=batch_size, use_vmap=use_vmap)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        return answer["hypotheses"], answer["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def serve(spec: dict) -> None:
    import ctranslate2

    model = ctranslate2.Translator(spec["model"], device="cpu", intra_threads=spec["threads"], inter_threads=1)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        r = json.loads(line)
        tic = time.perf_counter()
        res = model.translate_batch(r["pieces"], max_batch_size=r["batch_size"], beam_size=r["beam"],
                                                  length_penalty=0.0, max_decoding_length=r["max_len"],
                                                  min_decoding_length=0, use_vmap=r.get("use_vmap", False))
        seconds = time.perf_counter() - tic
        print(json.dumps({"hypotheses": [x.hypotheses[0] for x in res], "seconds": seconds}), flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
