"""The kernels other CPUs take, tested on this one too.

PyTorch picks its CPU kernels once per process by the instruction sets the CPU has, and oneDNN its own: on an
AVX-512 machine the AVX2 paths an AMD Zen 3 runs would never be tested here, and they differ (their bf16 is
emulated, their reductions run in other orders; an AVX2 SDPA kernel once made bf16 greedy tokens depend on the
batch). So the attention, decoding and precision oracle tests run a second time in a process whose kernels are
capped to AVX2 by PyTorch's and oneDNN's own switches, ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2.
On a CPU that has no more than AVX2 the run repeats the kernels of the main run; it is kept, so that every
machine runs the same checks.

Everything in those modules runs capped; none needs an exception (tests/test_precision.py checks the prepacked
bf16 product where oneDNN can pack bf16, and the plain product it falls back to where, as here, it cannot)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
ORACLES = ["attention/test_attention.py", "attention/test_attention_kernels.py", "decode/test_decode.py",
           "decode/test_decode_kernels.py", "decode/test_beam.py", "decode/test_search.py", "test_precision.py"]


def test_the_attention_decoding_and_precision_oracles_pass_on_avx2_kernels():
    env = {**os.environ, **CAPPED}
    probe = ("import torch, tformer.precision as p; print(torch.backends.cpu.get_cpu_capability()); "
             "print(p.dispatch_cap('bf16'))")
    seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    capability, why = seen.stdout.split("\n")[:2]
    assert capability == "AVX2", seen.stdout  # the switches took: the run below is on AVX2 kernels
    assert why.startswith("PyTorch runs its AVX2 kernels"), why  # and bf16 there is emulated, as on a Zen 3
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          *[str(ROOT / "tests" / m) for m in ORACLES]],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, tail
