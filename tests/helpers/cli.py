"""The command line as a user runs it: `python -m tformer ...` in a subprocess."""

import os
import subprocess
import sys

from helpers import ROOT


def tformer(*args, stdin=None, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tformer", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
