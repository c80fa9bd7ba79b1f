"""Run one tutorial page as the docs build would, without building the site: a quick loop for writing a page.

    python docs/_ext/run_page.py docs/tutorials/03-beam-search.md [--work /tmp/docs-work] [--quiet]

Reads the MyST notebook, executes it in a fresh kernel in the work folder (``data/`` linked to the offline
corpora, ``runs/`` for models, as the build sets up), prints every cell's output and the time each took, and
exits with status 1 when a cell raises. The full build (``python -m sphinx -W docs OUT``) remains the judge.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from myst_nb.core.read import read_myst_markdown_notebook
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from tformer_docs import use_work_folder

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("page")
    p.add_argument("--work", default=str(ROOT / "docs" / "_build" / "work"), help="the build's work folder")
    p.add_argument("--quiet", action="store_true", help="print only errors and timings")
    args = p.parse_args()
    work = Path(args.work).resolve()
    use_work_folder(work)
    nb = read_myst_markdown_notebook(Path(args.page).read_text(encoding="utf-8"), path=args.page)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(work)}})
    start = time.perf_counter()
    status = 0
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                t0 = time.perf_counter()
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as error:
                    print(f"--- cell {index} RAISED:\n{error}", file=sys.stderr)
                    status = 1
                    break
                print(f"--- cell {index}: {time.perf_counter() - t0:.1f} s")
                if not args.quiet:
                    for out in cell.get("outputs", []):
                        if out.get("output_type") == "stream":
                            print(out["text"], end="")
                        elif "data" in out:
                            data = out["data"]
                            kinds = ", ".join(k for k in data if k != "text/plain")
                            print(data.get("text/plain", ""), f"[{kinds}]" if kinds else "")
    finally:
        print(f"=== {args.page}: {time.perf_counter() - start:.1f} s", "(failed)" if status else "")
    nbformat.validate(nb)
    return status


if __name__ == "__main__":
    sys.exit(main())
