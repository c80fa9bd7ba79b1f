"""HTML as lxml reads it, for the markup oracles: the fixture pages, the tags and the pass-through elements
of a tree."""

import collections
import re

import lxml.etree
import lxml.html

import helpers

FIXTURES = sorted((helpers.FIXTURES / "html").glob("*.html"))
PASS = {"code", "pre", "script", "style", "kbd", "samp", "var", "textarea"}


def _read(html: str):
    """lxml's own reading: the root of a document, or a <div> around a fragment."""
    if re.match(r"\s*<!doctype", html, re.IGNORECASE):
        return lxml.html.document_fromstring(html)
    return lxml.html.fragment_fromstring(html, create_parent="div")


def _is_pass(el) -> bool:
    return not isinstance(el.tag, str) or el.tag in PASS or el.get("translate") == "no"


def _tags(root) -> collections.Counter:
    """Every element as (tag, attributes), comments as their text."""
    return collections.Counter((el.tag, tuple(sorted(el.attrib.items()))) if isinstance(el.tag, str)
                               else ("<!---->", el.text) for el in root.iter())


def _passed(root) -> collections.Counter:
    """Every pass-through element written out whole (without its tail)."""
    out = collections.Counter()
    for el in root.iter():
        if _is_pass(el) and not any(_is_pass(a) for a in el.iterancestors()):
            out[lxml.etree.tostring(el, encoding="unicode", method="html", with_tail=False)] += 1
    return out
