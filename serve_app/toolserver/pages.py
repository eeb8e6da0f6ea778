"""A local file as the browser shows it: text with gpt-oss's link marks, a title, its links.

The browser gpt-oss was trained on shows a page as plain text in which each link reads
`【{id}†{text}】` (`【{id}†{text}†{domain}】` when it leaves the page's site) and the model opens
a link by its id. A page's own text may not contain those brackets (it could fake a link), so
they become `〖〗`, as the reference browser does. HTML is reduced to text with the standard
library's parser (headings as `#`, list items as `  * `, blocks as paragraphs), Markdown and
plain text are kept as written, Markdown links `[text](href)` becoming link marks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

# What a page's own text may not hold: the link brackets, and a zero-width space.
_SPECIAL = str.maketrans({"【": "〖", "】": "〗", "\u200b": None})
_BLANK_RUNS = re.compile(r"\n(\s*\n)+")
_MD_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_MD_TITLE = re.compile(r"^\s{0,3}#\s+(.+?)\s*#*\s*$", re.MULTILINE)
_BLOCKS = {"p", "div", "section", "article", "header", "footer", "main", "nav", "table", "tr"}
_BLOCKS |= {"ul", "ol", "pre", "blockquote", "br", "hr", "dl", "dt", "dd", "figure", "aside"}
_SKIPPED = {"script", "style", "head", "noscript", "template", "svg", "math"}


@dataclass
class PageText:
    """A page's display text and the links it shows, by id (`"0"`, `"1"`, ...)."""

    title: str
    text: str
    urls: dict[str, str] = field(default_factory=dict)


class _Links:
    """Numbers a page's links in order of appearance, one id per distinct target."""

    def __init__(self, page_url: str) -> None:
        self.page_url = page_url
        self.urls: dict[str, str] = {}
        self._ids: dict[str, str] = {}

    def mark(self, text: str, href: str) -> str:
        text = " ".join(text.split()).replace("†", "‡")
        if not text or href.startswith(("#", "mailto:", "javascript:")):
            return text
        target = urljoin(self.page_url, href)
        if target not in self._ids:
            self._ids[target] = str(len(self.urls))
            self.urls[self._ids[target]] = target
        link_id = self._ids[target]
        domain = urlsplit(target).netloc
        if domain and domain != urlsplit(self.page_url).netloc:
            return f"【{link_id}†{text}†{domain}】"
        return f"【{link_id}†{text}】"


class _HtmlText(HTMLParser):
    """HTML to the browser's text: blocks as paragraphs, links as marks, no scripts."""

    def __init__(self, links: _Links) -> None:
        super().__init__(convert_charrefs=True)
        self.links = links
        self.out: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False
        self._pre = 0
        self._link: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIPPED:
            self._skip += 1
        elif tag == "a" and (href := dict(attrs).get("href")):
            self._link = (href, [])
        elif tag in {"h1", "h2", "h3", "h4", "h5", "h6"}:
            self.out.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "li":
            self.out.append("\n  * ")
        elif tag == "pre":
            self._pre += 1
            self.out.append("\n\n")
        elif tag in {"td", "th"}:
            self.out.append(" ")
        elif tag == "img":
            alt = dict(attrs).get("alt")
            self.out.append(f"[Image: {alt}]" if alt else "[Image]")
        elif tag in _BLOCKS:
            self.out.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIPPED:
            self._skip = max(0, self._skip - 1)
        elif tag == "a" and self._link is not None:
            href, parts = self._link
            self._link = None
            self.out.append(self.links.mark("".join(parts), href))
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
            self.out.append("\n\n")
        elif tag in _BLOCKS or tag in {"h1", "h2", "h3", "h4", "h5", "h6"}:
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._skip:
            return
        if not self._pre:
            data = re.sub(r"\s+", " ", data)
        if self._link is not None:
            self._link[1].append(data)
        else:
            self.out.append(data)


def _tidy(text: str) -> str:
    """Trailing spaces off, at most one blank line between paragraphs."""
    lines = [line.rstrip() for line in text.split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def html_page(source: str, url: str, fallback_title: str) -> PageText:
    links = _Links(url)
    parser = _HtmlText(links)
    parser.feed(source.translate(_SPECIAL))
    parser.close()
    text = _tidy("".join(parser.out))
    title = " ".join(parser.title.split())
    if not title:
        heading = _MD_TITLE.search(text)
        title = heading.group(1) if heading else fallback_title
    return PageText(title=title, text=text, urls=links.urls)


def markdown_page(source: str, url: str, fallback_title: str) -> PageText:
    links = _Links(url)
    text = _MD_LINK.sub(lambda m: links.mark(m.group(1), m.group(2)), source.translate(_SPECIAL))
    heading = _MD_TITLE.search(text)
    return PageText(
        title=heading.group(1) if heading else fallback_title, text=_tidy(text), urls=links.urls
    )


def plain_page(source: str, fallback_title: str) -> PageText:
    return PageText(title=fallback_title, text=_tidy(source.translate(_SPECIAL)))
