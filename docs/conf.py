"""Sphinx configuration of tformer's documentation site (build: `python -m tformer.docs` or `sphinx-build -W docs
OUT`). Tutorials are MyST notebooks executed at every build with the library itself; the reference is generated
from the code (autodoc, the command line's own parser, the config dataclasses, the packaged recipes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "tformer"
author = "the tformer developers"
copyright = "2026, the tformer developers"

extensions = [
    "myst_nb",                 # MyST Markdown pages and executable notebooks (.md with a kernelspec)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",           # the command line's reference, from tformer.cli.build_parser()
    "sphinx_design",           # the landing page's grid and cards (its CSS and JS ship with it: nothing fetched)
    "tformer_docs",            # docs/_ext: config fields, recipes, the build's work folder, checks after the build
]

exclude_patterns = ["_build", "**/.ipynb_checkpoints", "_ext", "README.md",
                    "results/headline.md"]  # included by results/index.md (and the README), not a page
root_doc = "index"
html_theme = "furo"
html_title = "tformer"
html_static_path: list[str] = []
# No asset from outside the site: furo ships its fonts and scripts; no MathJax (formulas are written in text
# and code), no CDN. tests/test_docs.py checks the built files.
html_use_opensearch = ""
myst_enable_extensions = ["colon_fence", "deflist"]
default_role = "code"  # `name` in a docstring reads as code, as in the source
smartquotes = False  # "--run-dir" stays two hyphens, quotes stay as typed (help texts, docstrings)
highlight_language = "text"  # usage lines and unmarked blocks are not Python; notebook cells and fences say theirs
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]  # RESULTS.md, included as written, starts its sections at level 2

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
napoleon_google_docstring = True

# Notebooks: every build runs every tutorial from scratch ("force"); a cell that raises fails the build.
nb_execution_mode = os.environ.get("TFORMER_DOCS_EXECUTE", "force")
if nb_execution_mode == "off":  # a quick build of the prose: unexecuted cells have no kernel to name their language
    suppress_warnings += ["myst-nb.lexer", "mystnb.glue"]  # nor the landing page's figure, which a cell glues
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
