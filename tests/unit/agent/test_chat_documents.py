"""The chat agent's document views: text from bytes (PDF via pypdf), aliases, slices, search,
chunks."""

import pytest

from fleet_agent.chat import documents as docs
from fleet_harness.pdf import tiny_pdf


def test_pdf_text_is_extracted() -> None:
    assert docs.text_of(tiny_pdf("Hello heron"), "", "a.pdf") == ("Hello heron", "application/pdf")
    # the content type alone is enough to read it as a PDF
    text, media = docs.text_of(tiny_pdf("by type"), "application/pdf", "b")
    assert (text, media) == ("by type", "application/pdf")


def test_a_broken_pdf_is_refused_with_what_to_do() -> None:
    with pytest.raises(docs.DocumentError) as refused:
        docs.text_of(b"%PDF-1.4 not really", "", "report.pdf")
    assert "'report.pdf' looks like a PDF but cannot be read" in str(refused.value)
    assert "upload a text export" in str(refused.value)


def test_other_bytes_are_utf8_text_with_replacements() -> None:
    assert docs.text_of("héron".encode(), "text/markdown", "n.md") == ("héron", "text/markdown")
    assert docs.text_of(b"a\xffb", "", "x") == ("a\ufffdb", "text/plain")


def test_aliases_come_from_the_origin_or_are_checked() -> None:
    assert docs.alias_for("https://example.com/reports/q3 final.txt", "") == "q3-final.txt"
    assert docs.alias_for("https://example.com/", "") == "example.com"
    assert docs.alias_for("x", "notes_1") == "notes_1"
    with pytest.raises(docs.DocumentError, match="alias 'a b' is not usable"):
        docs.alias_for("x", "a b")


def test_a_slice_is_numbered_and_bounded() -> None:
    text = "\n".join(f"line {n}" for n in range(1, 11))
    assert docs.read_slice(text, 9, 5) == "9: line 9\n10: line 10\n[lines 9-10 of 10]"
    with pytest.raises(docs.DocumentError, match="past the end: the text has 10 lines"):
        docs.read_slice(text, 11, 1)
    with pytest.raises(docs.DocumentError, match="lines start at 1"):
        docs.read_slice(text, 0, 1)
    assert docs.read_slice(text, 1, 10_000).count("\n") == 10  # capped at SLICE_LINES anyway


def test_find_is_case_insensitive_literal_unless_regex() -> None:
    text = "Alpha\nbeta (b)\nALPHA beta"
    assert docs.find(text, "alpha") == "1: Alpha\n3: ALPHA beta"
    assert docs.find(text, "(b)") == "2: beta (b)"
    assert docs.find(text, "^beta", regex=True) == "2: beta (b)"
    assert docs.find(text, "gamma") == "no line matches 'gamma'"
    with pytest.raises(docs.DocumentError, match="not a valid regular expression"):
        docs.find(text, "(", regex=True)


def test_chunks_cover_the_text_exactly_and_cut_at_paragraphs() -> None:
    text = ("word " * 100 + "\n\n") * 30
    parts = docs.chunks(text, 1_000)
    assert "".join(text[c.start : c.end] for c in parts) == text
    assert all(text[c.start : c.end].endswith("\n\n") for c in parts)
    assert [c.index for c in parts] == list(range(len(parts)))
