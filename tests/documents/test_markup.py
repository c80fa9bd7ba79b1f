"""HTML translation with markup kept (tformer.documents.markup) against oracles written out here.

Oracles: an identity translator (target = segment, word i -> word i) must give back the input's DOM (tags,
attributes, text with whitespace normalised), read by lxml.html directly; a word-reversal translator, and a
random one (hypothesis: any words, any alignment pairs, crossing or none), must give output that reads and
writes back byte for byte, with the input's multiset of tags+attributes, its pass-through elements
(comments, code, pre, script, style, kbd, var, textarea, translate="no") unchanged, and exactly the target
words, in order, as its translatable text (whitespace aside: words that follow on as in the source keep its
spacing); small cases are checked against their expected strings, and identity against the parsed input."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.markup import FIXTURES, _is_pass, _passed, _read, _tags
from tformer.documents.markup import parse_html
from tformer.errors import DataError


def _norm(text) -> str:
    return " ".join((text or "").split())


def _dom(el):
    """(tag, attributes, text, children, tail), whitespace normalised: the tree the identity must keep."""
    tag = el.tag if isinstance(el.tag, str) else "<!---->"
    return (tag, sorted(el.attrib.items()) if isinstance(el.tag, str) else [], _norm(el.text),
            [_dom(c) for c in el], _norm(el.tail))


def _letters(root) -> str:
    """The translatable text in document order, outside pass-through elements, without its whitespace."""
    parts = []

    def walk(el):
        if not _is_pass(el):
            parts.append(el.text or "")
            for c in el:
                walk(c)
        parts.append(el.tail or "")

    walk(root)
    return "".join("".join(parts).split())


def _identity(segment):
    n = len(segment.split())
    return segment, [(i, i) for i in range(n)]


def _reversal(segment):
    words = segment.split()
    return " ".join(reversed(words)), [(i, len(words) - 1 - i) for i in range(len(words))]


def _check_output(html: str, out: str, targets: list[str]) -> None:
    """The oracles every translator shares: reading and writing the output again changes nothing; lxml
    reads in it the input's tags and pass-through content, and exactly the target words."""
    assert parse_html(out).html == out
    source, result = _read(html), _read(out)
    assert _tags(result) == _tags(source)
    assert _passed(result) == _passed(source)
    # every target character once, in order (spaces aside: words may follow on as in the source, a.<sup>[1])
    assert _letters(result) == "".join("".join(targets).split())


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_identity_translation_gives_back_the_input_tree(path):
    html = path.read_text()
    doc = parse_html(html)
    assert doc.segments and all(s == _norm(s) for s in doc.segments)
    out = doc.render([_identity(s) for s in doc.segments])
    assert _dom(_read(out)) == _dom(_read(html))
    _check_output(html, out, doc.segments)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_reversed_words_keep_tags_pass_through_and_every_word(path):
    html = path.read_text()
    doc = parse_html(html)
    translations = [_reversal(s) for s in doc.segments]
    _check_output(html, doc.render(translations), [t for t, _ in translations])


def test_reversal_moves_tags_with_their_words():
    doc = parse_html("<p>one <b>two three</b> four</p>")
    assert doc.segments == ["one two three four"]
    assert doc.render([_reversal(doc.segments[0])]) == "<p>four <b>three two</b> one</p>"


def test_tags_follow_alignment_and_unaligned_elements_are_anchored():
    doc = parse_html('<p>The <a href="/x">red house</a> is <b>big</b><br>Yes</p>')
    assert doc.segments == ["The red house is big Yes"]
    pairs = [(0, 0), (1, 2), (2, 1), (3, 3), (5, 5)]
    out = doc.render([("La maison rouge est grande Oui", pairs + [(4, 4)])])
    assert out == '<p>La <a href="/x">maison rouge</a> est <b>grande</b><br>Oui</p>'
    # "big" unaligned: <b> and the <br> after it go after "est", the target of the nearest aligned word before
    out = doc.render([("La maison rouge est grande Oui", pairs)])
    assert out == '<p>La <a href="/x">maison rouge</a> est <b></b><br>grande Oui</p>'
    # crossing alignments: the later sibling shrinks, and children stay inside their parent
    doc = parse_html("<p><b>one <i>two</i> three</b> <u>four</u></p>")
    out = doc.render([("A B C D", [(0, 0), (1, 3), (2, 1), (3, 2)])])
    assert out == "<p><b>A B C <i>D</i></b> <u></u></p>"


def test_punctuation_outside_a_tag_stays_outside():
    doc = parse_html('<p>See <a href="/a">the link</a>, or un<b>believ</b>able (<i>this</i>).</p>')
    assert doc.segments == ["See the link, or unbelievable (this)."]
    pairs = [(0, 0), (1, 2), (2, 3), (3, 4), (4, 5), (5, 1)]
    out = doc.render([("Voir (ceci). le lien, ou unbelievable", pairs)])
    assert out == '<p>Voir (<i>ceci</i>). <a href="/a">le lien</a>, ou un<b>believ</b>able</p>'


def test_documents_stay_documents_and_fragments_stay_fragments():
    doc = parse_html((FIXTURES[0].parent / "full_document.html").read_text())
    out = doc.render([_identity(s) for s in doc.segments])
    assert out.startswith("<!DOCTYPE html>\n<html") and "<title>Welcome to the Example Museum</title>" in out
    assert doc.segments[0] == "Welcome to the Example Museum"
    fragment = parse_html("<b>bold</b> text")
    assert fragment.render([_identity("bold text")]) == "<b>bold</b> text"
    bare = parse_html("<html><body><p>x</p></body></html>")
    assert bare.render([("y", [(0, 0)])]) == "<html><body><p>y</p></body></html>"


def test_pass_through_is_in_no_segment_and_attributes_are_not_translated():
    text = " ".join(" ".join(parse_html(p.read_text()).segments) for p in FIXTURES)
    for kept in ("ls -la", "Enter", "alert", "color", "SuperWidget", "Widget Holdings", "Default text",
                 "tracking", "lighthouse at sunset", "returns\" section", "pip install"):
        assert kept not in text, kept
    doc = parse_html((FIXTURES[0].parent / "wikipedia_paragraph.html").read_text())
    assert doc.segments[0].startswith("René Descartes (31 March 1596 – 11 February 1650)")
    out = doc.render([_identity(s) for s in doc.segments])
    assert "&amp; of rationalism" in out and 'href="#cite_note-1">[1]</a></sup>' in out


def test_empty_and_whitespace_input_have_no_segments():
    for html in ("", "  \n", "<p> </p>", "<!-- only a comment --><br>"):
        doc = parse_html(html)
        assert doc.segments == [] and doc.render([]) == doc.html


def test_identity_translation_gives_back_the_parsed_input_byte_for_byte():
    # the one exception: whitespace inside an element after its last word (<b>tag\n</b>) is not kept
    for path in FIXTURES:
        doc = parse_html(path.read_text())
        out = doc.render([_identity(s) for s in doc.segments])
        assert out == doc.html or path.stem == "unclosed", path.stem


random_words = st.text("abcxyz,.()[]&<'\"é", min_size=1, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_alignment_gives_well_formed_output_with_every_word(data):
    path = data.draw(st.sampled_from(FIXTURES))
    html = path.read_text()
    doc = parse_html(html)
    translations = []
    for segment in doc.segments:
        source = segment.split()
        n = len(source)
        target = data.draw(st.lists(st.one_of(st.sampled_from(source), random_words), max_size=n + 3))
        m = len(target)
        pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, m - 1)), max_size=2 * n)) \
            if m else []
        diagonal = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))  # runs of words that follow on
        pairs += [(i, i) for i, keep in enumerate(diagonal) if keep and i < m]
        translations.append((" ".join(target), data.draw(st.permutations(pairs))))
    _check_output(html, doc.render(translations), [t for t, _ in translations])


@pytest.mark.parametrize("html, message", [
    (b"<p>bytes</p>", "needs the HTML as text"),
    ("<p>ok</p>\n<p>bad \x01 here</p>", "line 2, column 8"),
    ("<p title='never closed>all of it is swallowed</p>", "unclosed quote"),
    ("<div>" * 300 + "deep", "Excessive depth"),
])
def test_unreadable_input_is_a_data_error_naming_where(html, message):
    with pytest.raises(DataError, match=re.escape(message)):
        parse_html(html)


def test_bad_translations_are_data_errors_naming_the_segment():
    doc = parse_html("<p>one two</p><p>three</p>")
    with pytest.raises(DataError, match="2 segments"):
        doc.render([("eins zwei", [])])
    with pytest.raises(DataError, match=r"translation 1: alignment pair \(0, 1\) is out of range"):
        doc.render([("eins zwei", [(0, 0)]), ("drei", [(0, 1)])])
    with pytest.raises(DataError, match="translation 0 is not a .target text, alignment. pair"):
        doc.render([(None, []), ("drei", [])])
    with pytest.raises(DataError, match="translation 0: the alignment must be"):
        doc.render([("eins zwei", [(0, "x")]), ("drei", [])])


def test_xml_like_inline_tags_and_custom_elements_stay_inside_their_segment():
    """Tags HTML does not know are inline, as a browser lays them out: a CAT tool's <g id>/<x1>/<bx/> or a
    custom element does not cut the sentence into pieces translated apart."""
    doc = parse_html('<p>Press <x1 id="k1">Save</x1> now, <g id="2">or <my-tip>wait</my-tip></g>.</p><div>Next</div>')
    assert doc.segments == ["Press Save now, or wait.", "Next"]


def test_an_element_with_no_aligned_word_before_it_is_anchored_at_the_start():
    # nothing aligned before <b> (its own word "Hi" unaligned) or before the leading <img>: both go to the
    # start, however far the last source word's target lies
    doc = parse_html('<p><b>Hi</b> there <img src="a.png"> friend</p>')
    assert doc.render([("dort Freund Hallo", [(1, 0), (2, 1)])]) == '<p><b></b> dort <img src="a.png"> Freund Hallo</p>'
    doc = parse_html('<p><img src="a.png"> Hello world</p>')
    assert doc.render([("Hallo Welt", [(0, 0), (1, 1)])]) == '<p><img src="a.png"> Hallo Welt</p>'


def test_an_anchored_element_goes_right_after_its_anchor_word_before_an_element_starting_there():
    # <img> anchors after "zwei" (target of "two"), where <i> (holding "one" -> "eins") starts too: the anchored
    # element comes first, whatever the document order of the two
    doc = parse_html('<p><i>one</i> two <img src="a.png"> three</p>')
    out = doc.render([("zwei eins drei", [(0, 1), (1, 0), (2, 2)])])
    assert out == '<p>zwei <img src="a.png"> <i>eins</i> drei</p>'


def test_the_end_of_a_block_counts_as_whitespace_after_an_element_moved_inside_it():
    # <br> ends the paragraph, so nothing follows it in the source; anchored between two target words it is
    # still followed by a space, as it was by the block's end
    doc = parse_html('<p>Hello world <img src="a.png"><br></p>')
    assert doc.render([("Hallo Welt", [(0, 0)])]) == '<p>Hallo <img src="a.png"> <br> Welt</p>'


def test_a_comment_inside_a_paragraph_does_not_split_its_segment():
    for html in ("<p>Hello <!-- note --> world</p>", "<p>Hello <?pi x?> world</p>"):
        assert parse_html(html).segments == ["Hello world"], html


def test_words_around_a_line_break_moved_between_them_do_not_run_together():
    # no whitespace on either side of <br> in the source; anchored between "A" and "B" it is still followed by
    # a space, since the two target words do not follow on as in the source
    doc = parse_html("<p>Hello<br>world</p>")
    assert doc.render([("A B C", [(0, 0), (1, 2)])]) == "<p>A<br> B C</p>"


def test_a_word_cut_by_two_nested_tags_keeps_both_outside_parts():
    doc = parse_html("<p>re<b>al<i>ly</i></b> good</p>")
    assert doc.render([("really good", [(0, 0), (1, 1)])]) == "<p>re<b>al<i>ly</i></b> good</p>"


def test_inline_content_between_two_blocks_stays_between_them():
    doc = parse_html("<div><p>one</p>two <b>three</b><p>four</p></div>")
    assert doc.segments == ["one", "two three", "four"]
    out = doc.render([("eins", [(0, 0)]), ("zwei drei", [(0, 0), (1, 1)]), ("vier", [(0, 0)])])
    assert out == "<div><p>eins</p>zwei <b>drei</b><p>vier</p></div>"


@pytest.mark.parametrize("html, message", [
    ("<p>bad \x01</p>\n<p>ok</p>\n", "HTML line 1, column 8: character '\\x01' cannot be read"),
    ("<p>a</p>\n<p>b</p>\n<p>c \x00</p>", "HTML line 3, column 6: character '\\x00' cannot be read"),
    ("<p title='never closed>all of it is swallowed</p>", "HTML cannot be read: the parser found no text or element"),
])
def test_an_unreadable_character_or_document_is_named_exactly(html, message):
    # the line counts only the newlines before the character, the column starts at the last one of them
    with pytest.raises(DataError, match=re.escape(message)):
        parse_html(html)


def test_a_translation_that_is_not_a_pair_is_a_data_error_whatever_its_type():
    doc = parse_html("<p>ab</p>")
    for translation in ("ab", 5, None):  # a two-letter string has a length of 2 but is no pair
        with pytest.raises(DataError, match="translation 0 is not a .target text, alignment. pair"):
            doc.render([translation])


def test_only_a_word_that_ran_across_a_tag_gives_its_outside_part_back():
    # "geometry." and "[1]" are two source words (punctuation cuts at <sup>), so the target word that <sup>
    # holds stays whole inside it, though it begins with the source word before the tag
    doc = parse_html("<p>See geometry.<sup>[1]</sup></p>")
    assert doc.segments == ["See geometry. [1]"]
    assert doc.render([("Voir geometry.[1]", [(0, 0), (2, 1)])]) == "<p>Voir <sup>geometry.[1]</sup></p>"
