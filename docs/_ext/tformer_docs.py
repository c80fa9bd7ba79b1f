"""Sphinx extension of tformer's docs: reference tables generated from the code, and the build's own checks.

- ``{tformer-config} ModelConfig`` renders a config dataclass as a table: key, type, default and meaning, the
  meaning read from the comment after each field in tformer/config.py (the source is the documentation).
- ``{tformer-recipes}`` lists the packaged recipes with the comment each YAML file starts with (the command that
  runs it and what it measured).
- The build's work folder: tutorials run in ``$TFORMER_DOCS_WORK`` (beside the HTML output unless set), where
  ``data/`` links to the offline corpora (``$TFORMER_SHARED_DATA``, default ``../shared/data``) and ``runs/``
  holds the models the tutorials train; ``TFORMER_CACHE`` points there too, so a build never writes ~/.cache.
- After the build: every executed page must have succeeded and taken measurable time (a page that ran in 0 s
  executed nothing), and the timings are written to ``<html>/_tformer/execution.json`` for the build report.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import os
import shutil
import tokenize
import typing
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

ROOT = Path(__file__).resolve().parents[2]
MIN_SECONDS = 0.5  # a page that executed in less did not run the library


def field_comments(path: Path, class_name: str) -> list[tuple[str, str]]:
    """A dataclass's documentation as its source writes it: ("field", name, meaning) for each field, the meaning
    being the comment after it and the comment lines right below (or, with none after it, the comment block
    right above it); ("note", "", text) for a comment block that follows a blank line and heads a group."""
    source = path.read_text(encoding="utf-8")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    fields = {n.lineno: n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    end = min([n.lineno for n in cls.body if isinstance(n, ast.FunctionDef)] + [cls.end_lineno + 1])
    lines = source.splitlines()
    out: list[tuple[str, str, str]] = []
    pending: list[str] = []  # a comment block not (yet) attached to a field
    continuing = False
    inside = 0  # the last line of a field written over several lines
    for row in range(cls.body[0].lineno, end):
        line = lines[row - 1].strip()
        if row <= inside:
            continue
        if row in fields:
            node = fields[row]
            own = [comments[r] for r in range(row, node.end_lineno + 1) if r in comments]
            if not own and pending:
                own, pending = pending, []
            if pending:
                out.append(("note", "", " ".join(pending)))
                pending = []
            out.append(("field", node.target.id, " ".join(own)))
            continuing, inside = bool(own) and node.end_lineno in comments, node.end_lineno
        elif line.startswith("#"):
            if continuing:
                name, text = out[-1][1], out[-1][2]
                out[-1] = ("field", name, f"{text} {comments[row]}")
            else:
                pending.append(comments[row])
        else:
            continuing = False
            if pending and not line:
                continue  # a block stays pending across blank lines until the field it heads
    return out


def type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _definitions(rows: list[tuple[str, str, str, str]]) -> list[nodes.Node]:
    """(key, type, default, meaning) rows -> definition lists (`key` · type · default `value`, then the meaning);
    a row without a key is a note heading the keys after it, set between the lists."""
    out: list[nodes.Node] = []
    for key, kind, default, meaning in rows:
        if not key:
            out.append(nodes.paragraph("", "", nodes.emphasis(meaning, meaning)))
            continue
        if not out or not isinstance(out[-1], nodes.definition_list):
            out.append(nodes.definition_list(classes=["tformer-config"]))
        term = nodes.term("", "", nodes.literal(key, key), nodes.Text(f"  ·  {kind}  ·  default "),
                          nodes.literal(default, default), ids=[f"key-{key}"])
        body = nodes.definition("", nodes.paragraph("", meaning or "(no comment in the source)"))
        out[-1] += nodes.definition_list_item("", term, body)
    return out


class ConfigTable(Directive):
    """``{tformer-config} ModelConfig [prefix]``: the fields of tformer.config.<ModelConfig>, each with its type,
    default and the comment that explains it in the source."""

    required_arguments = 1
    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        from tformer import config

        cls = getattr(config, self.arguments[0])
        prefix = self.arguments[1] if len(self.arguments) > 1 else ""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        rows = []
        for kind, name, text in field_comments(Path(config.__file__), cls.__name__):
            if kind == "note":
                rows.append(("", "", "", text))
                continue
            f = fields.pop(name)
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:  # a nested section: see its own list
                default = f"{type(f.default_factory()).__name__}()"
            else:
                default = "(required)"
            text = " ".join(filter(None, (f.metadata.get("help"), text)))  # config_checks.option's help first
            rows.append((f"{prefix}{name}", type_name(hints[name]), default, text))
        if fields:
            raise ExtensionError(f"{cls.__name__}: fields the source reader missed: {sorted(fields)}")
        return _definitions(rows)


class RecipeList(Directive):
    """``{tformer-recipes}``: each packaged recipe with the comment block it starts with."""

    def run(self) -> list[nodes.Node]:
        from tformer.recipes import __file__ as recipes_init

        out: list[nodes.Node] = []
        for path in sorted(Path(recipes_init).parent.glob("*.yaml")):
            head = []
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.startswith("#"):
                    break
                head.append(line[1:].removeprefix(" "))
            section = nodes.section(ids=[f"recipe-{path.stem}"], names=[f"recipe {path.stem}"])
            section += nodes.title(path.stem, path.stem)
            section += nodes.literal_block("\n".join(head), "\n".join(head))
            out.append(section)
        return out


def _rst_text(text: str | None) -> str | None:
    """Plain help text as reStructuredText that shows it as written (sphinx-argparse reads help as rST)."""
    if not text:
        return text
    for char in "\\*`|_":
        text = text.replace(char, "\\" + char)
    return text


def rst_parser():
    """tformer.cli.build_parser(), its help texts escaped for sphinx-argparse (the reference's CLI page)."""
    import argparse

    from tformer.cli import build_parser

    def escape(parser: argparse.ArgumentParser) -> None:
        parser.description, parser.epilog = _rst_text(parser.description), _rst_text(parser.epilog)
        for action in parser._actions:
            if action.help not in (None, argparse.SUPPRESS):
                action.help = _rst_text(action.help)
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    choice.help = _rst_text(choice.help)
                for sub in set(action.choices.values()):
                    escape(sub)

    parser = build_parser()
    escape(parser)
    return parser


def use_work_folder(work: Path, fresh: bool = False) -> None:
    """Make `work` the folder the pages run in (``runs/`` emptied when `fresh`, ``data/`` linked to the corpora)
    and set the environment the kernels inherit. Without the corpora the build stops with one line (SystemExit:
    Sphinx reports any other exception with a traceback and a request to report a bug to Sphinx)."""
    if fresh and (work / "runs").is_dir():
        shutil.rmtree(work / "runs")  # every build trains its models afresh, as the pages say
    (work / "runs").mkdir(parents=True, exist_ok=True)
    shared = Path(os.environ.get("TFORMER_SHARED_DATA") or ROOT.parent / "shared" / "data").resolve()
    data = work / "data"
    if not data.exists():
        if not (shared / "multi30k").is_dir():
            raise SystemExit(f"tformer docs: error: the tutorials read Multi30k from {shared}/multi30k, which does "
                             "not exist: run `tformer data multi30k --out DIR/multi30k` and set "
                             "TFORMER_SHARED_DATA=DIR (or place the offline shared/data beside the repository)")
        data.symlink_to(shared, target_is_directory=True)
    os.environ["TFORMER_DOCS_WORK"] = str(work)
    os.environ.setdefault("TFORMER_CACHE", str(work / "cache"))
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars are for terminals; a built page shows results
    # figures inline, as in any notebook, whatever the process that started the build chose (the command line
    # sets MPLBACKEND=Agg for itself, and a test process may have run it)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"


def prepare_work_folder(app: Sphinx, config) -> None:
    given = os.environ.get("TFORMER_DOCS_WORK")
    work = Path(given or Path(app.outdir).parent / "work").resolve()
    use_work_folder(work, fresh=not given and config.nb_execution_mode == "force")


FIRST = "start/first-model"  # trains the model that later pages load (they train it only if it is missing)


def first_model_first(app: Sphinx, env, docnames: list[str]) -> None:
    """Read (so execute) the page that trains the shared model before every other page."""
    if FIRST in docnames:
        docnames.remove(FIRST)
        docnames.insert(0, FIRST)


def check_execution(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    from myst_nb.sphinx_ import NbMetadataCollector

    report = {}
    for docname in sorted(app.env.found_docs):
        data = NbMetadataCollector.get_exec_data(app.env, docname)
        if data:
            report[docname] = {"seconds": round(data["runtime"] or 0.0, 2), "succeeded": bool(data["succeeded"]),
                               "method": data["method"]}
    failed = [d for d, r in report.items() if not r["succeeded"] or r["seconds"] < MIN_SECONDS]
    if app.config.nb_execution_mode != "off" and failed:
        raise ExtensionError(f"notebook pages that failed or executed in under {MIN_SECONDS} s: {failed}")
    out = Path(app.outdir) / "_tformer"
    out.mkdir(exist_ok=True)
    (out / "execution.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def setup(app: Sphinx) -> dict:
    app.add_directive("tformer-config", ConfigTable)
    app.add_directive("tformer-recipes", RecipeList)
    app.connect("config-inited", prepare_work_folder, priority=100)
    app.connect("env-before-read-docs", first_model_first)
    app.connect("build-finished", check_execution)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
