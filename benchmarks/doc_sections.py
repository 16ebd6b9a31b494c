"""Generated sections of a document: the text between a command's begin and end markers."""

from __future__ import annotations


class DocSectionError(ValueError):
    """The document lacks the markers of the section a command writes."""


def replace_section(document: str, section: str, begin: str, end: str) -> str:
    """``document`` with the text from ``begin`` to ``end`` replaced by ``section`` (which carries
    the markers itself, so the command can replace it again)."""
    if begin not in document or end not in document:
        raise DocSectionError(
            f"the document has no {begin} … {end} section to replace: add the two marker lines where the "
            "generated text belongs"
        )
    head, rest = document.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + section + tail
