"""Checkable facts in a text: numbers, dates and proper names, and those a summary states that its document lacks.

Used by the hallucination metric (every val pass) and by the offline rubric reward. Lexical on purpose:
deterministic, instant, no judge. What it counts as a fact:

- a number (``2,100`` = ``2100``; ordinals ``21st`` count as ``21``), which covers years and day numbers;
- a month or weekday name (a date's words);
- a proper name: a capitalized word that does not open a sentence (``"... visited Lake Tahoe"``), or an
  all-caps acronym anywhere. A sentence's first word is skipped, since capitals there say nothing, and so are
  headings (a ``#`` line, a short line ending in ``:``, a short Title Case line), whose capitals are style.
  Hyphenated words are read part by part (``Hollis-based`` names ``Hollis``).

List markers (``1.``, ``2)`` at the start of a line) are layout, not numbers.

A fact is *absent* from the document when its words do not occur there, ignoring case (a summary that
writes "Park" for the document's "park" invents nothing). Numbers spelled out in words ("three") are not
matched with digits: such a summary is counted as inventing, which errs towards reporting.
"""

from __future__ import annotations

import re

MONTHS = ("january february march april may june july august september october november december "
          "jan feb mar apr jun jul aug sep sept oct nov dec").split()
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
# Date words that are also everyday English ("they may vote", "march past", "mar the view"): dates only capitalized
EVERYDAY = frozenset({"may", "march", "mar"})
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")
_LIST_MARKER = re.compile(r"^(\s*(?:[-*•>]\s*)?)\d{1,3}[.)](?=\s)", re.M)
_WORD = re.compile(r"[^\W\d_][^\W\d_'’]*")  # a word of letters, of any script ("Ramón", "Москва")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|^\s*(?:[-*•>]+\s*|\d+[.)]\s+)|[\"“(\[]\s*)$")
_MARKUP = re.compile(r"[*_`#]+")
_BULLET = re.compile(r"^\s*(?:[-*•>]|\d+[.)])\s")


def _unlisted(text: str) -> str:
    return _LIST_MARKER.sub(r"\1", text)


def numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(_unlisted(text))}


def _words_lower(text: str) -> set[str]:
    return {_stem(w.lower()) for w in _WORD.findall(text)}


def _stem(word: str) -> str:
    return re.sub(r"(['’]s|['’])$", "", word)


def _heading(line: str) -> bool:
    """A heading's capitals are style, not names: ``# Title``, ``Key Points:``, ``Opening Ceremony``."""
    if line.lstrip().startswith("#"):
        return True
    if _BULLET.match(line):
        return False
    text = _MARKUP.sub("", line).strip()
    words = text.split()
    if not words or len(words) > 8:
        return False
    if text.endswith(":"):
        return True
    return text[-1] not in ".!?;," and all(w[0].isupper() or not w[0].isalpha() for w in words) and len(words) > 1


def names(text: str) -> list[str]:
    """Proper names and date words (case kept), in order of first appearance."""
    found: dict[str, None] = {}
    for line in text.splitlines():
        heading = _heading(line)
        line = _MARKUP.sub("", line)
        for match in _WORD.finditer(line):
            word = _stem(match.group())
            lower = word.lower()
            if (lower in MONTHS or lower in WEEKDAYS) and (lower not in EVERYDAY or word[0].isupper()):
                found[word] = None
                continue
            if heading:
                continue
            acronym = len(word) >= 2 and word.isupper()
            capitalized = word[0].isupper() and not _SENTENCE_START.search(line[:match.start()])
            if acronym or (capitalized and len(word) > 1):
                found[word] = None
    return list(found)


def facts(text: str) -> list[str]:
    """Every number, date word and proper name of ``text``, in order of first appearance."""
    ordered = {n: None for n in (m.replace(",", "").rstrip(".") for m in _NUMBER.findall(_unlisted(text)))}
    ordered.update({n: None for n in names(text)})
    return list(ordered)


def invented_facts(summary: str, document: str) -> list[str]:
    """The numbers, dates and proper names ``summary`` states that ``document`` does not contain."""
    doc_numbers, doc_words = numbers(document), _words_lower(document)
    invented = sorted(numbers(summary) - doc_numbers, key=summary.find)
    invented += [n for n in names(summary) if n.lower() not in doc_words]
    return invented


def hallucinates(summary: str, document: str) -> bool:
    return bool(invented_facts(summary, document))
