"""The browser's world: the documents of one local folder, and a ranked search over them.

Each text, Markdown or HTML file under the folder (hidden files, symlinks and files over
`MAX_FILE_BYTES` left out) is one page, at `{base_url}{its path in the folder}`. Search ranks
pages by BM25 over their words (a title's words counted twice), the ranking most search
engines start from; nothing leaves the machine.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from serve_app.toolserver.pages import PageText, html_page, markdown_page, plain_page

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_DOCUMENTS = 10_000
SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst", ".html", ".htm"}
DEFAULT_BASE_URL = "http://docs.local/"
_WORD = re.compile(r"\w+")
_LINK_MARK = re.compile(r"【\d+†([^†】]+)(?:†[^†】]+)?】")
_K1, _B = 1.5, 0.75


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Document:
    """One file as a page: its URL, title, display text and links."""

    path: str
    url: str
    page: PageText
    source_path: Path
    # The paragraphs a search result's snippet is chosen from, each with its words (read once).
    paragraphs: tuple[tuple[str, frozenset[str]], ...] = ()


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float
    snippet: str


def read_document(root: Path, file: Path, base_url: str) -> Document:
    path = file.relative_to(root).as_posix()
    url = base_url + quote(path)
    source = file.read_text(encoding="utf-8", errors="replace")
    suffix = file.suffix.lower()
    if suffix in {".html", ".htm"}:
        page = html_page(source, url, fallback_title=file.stem)
    elif suffix in {".md", ".markdown"}:
        page = markdown_page(source, url, fallback_title=file.stem)
    else:
        page = plain_page(source, fallback_title=file.stem)
    return Document(path, url, page, source_path=file, paragraphs=paragraphs(page.text))


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, subfolders, names in os.walk(root, followlinks=False):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for name in sorted(names):
            file = Path(folder) / name
            if name.startswith(".") or file.is_symlink() or file.suffix.lower() not in SUFFIXES:
                continue
            if file.stat().st_size <= MAX_FILE_BYTES:
                found.append(file)
    return found[:MAX_DOCUMENTS]


class DocumentFolder:
    """The documents of one folder, read once at start, and their BM25 index."""

    def __init__(self, root: Path, base_url: str = DEFAULT_BASE_URL) -> None:
        if not root.is_dir():
            raise ValueError(f"the document folder {root} is not a directory")
        self.root = root.resolve()
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.documents = [read_document(self.root, f, self.base_url) for f in _files(self.root)]
        self._by_url = {d.url: d for d in self.documents}
        self._terms = [Counter(self._indexed_words(d)) for d in self.documents]
        self._lengths = [sum(t.values()) for t in self._terms]
        self._average = sum(self._lengths) / len(self._lengths) if self._lengths else 0.0
        self._frequency: Counter[str] = Counter()
        for terms in self._terms:
            self._frequency.update(terms.keys())

    @staticmethod
    def _indexed_words(document: Document) -> list[str]:
        return words(document.page.title) * 2 + words(document.page.text)

    def find(self, url_or_path: str) -> Document | None:
        """The document at a URL, or at a path in the folder (`guide.md`, `/guide.md`)."""
        if found := self._by_url.get(url_or_path):
            return found
        path = unquote(url_or_path.removeprefix(self.base_url)).lstrip("/")
        return self._by_url.get(self.base_url + quote(path))

    def search(self, query: str, topn: int) -> list[Hit]:
        terms = set(words(query))
        total = len(self.documents)
        scored: list[tuple[float, int]] = []
        for index, counts in enumerate(self._terms):
            score = 0.0
            for term in terms & counts.keys():
                seen_in = self._frequency[term]
                rarity = math.log(1 + (total - seen_in + 0.5) / (seen_in + 0.5))
                tf = counts[term]
                norm = _K1 * (1 - _B + _B * self._lengths[index] / (self._average or 1.0))
                score += rarity * tf * (_K1 + 1) / (tf + norm)
            if score > 0:
                scored.append((score, index))
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [
            Hit(self.documents[i], score, snippet(self.documents[i].paragraphs, terms))
            for score, i in scored[:topn]
        ]


def paragraphs(text: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """A page's paragraphs (not its headings), each with the set of its words."""
    kept = [p for p in text.split("\n\n") if p.strip() and not p.lstrip().startswith("#")]
    return tuple((p, frozenset(words(p))) for p in kept)


def snippet(
    paragraphs: tuple[tuple[str, frozenset[str]], ...], terms: set[str], width: int = 200
) -> str:
    """The paragraph that holds most of the query's words, cut to about `width` characters."""
    if not paragraphs:
        return ""
    best, _ = max(paragraphs, key=lambda paragraph: len(terms & paragraph[1]))
    flat = " ".join(_LINK_MARK.sub(r"\1", best).split())
    return flat if len(flat) <= width else flat[: width - 3].rsplit(" ", 1)[0] + "..."
