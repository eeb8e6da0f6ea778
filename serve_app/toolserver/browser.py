"""gpt-oss's `browser` tool over a document folder: `search`, `open` and `find`, shown as the
model was trained to read them.

Every call answers with one browsing display: `[{cursor}] {title} ({url})`, the line
`**viewing lines [{first} - {last}] of {last line}**`, then the page's lines, each numbered
`L{n}: `, wrapped at 80 characters. The model cites them as `【{cursor}†L{n}-L{m}】`. The cursor
is the page's index in its session's page stack: every search, open and find pushes a page.
Links on a page read `【{id}†{text}】`; `open(id=3)` follows link 3 of the current page (or of
the page at `cursor`), `open(id="http://...")` opens a URL, `open()` with only `loc` scrolls.
This is the display of the `gpt-oss` package's reference browser (gpt_oss/tools/simple_browser),
written afresh over a local folder instead of a web search API.
"""

from __future__ import annotations

import re
import textwrap
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote

from serve_app.toolserver.documents import Document, DocumentFolder

VIEW_CHARS = 4096  # about the reference's 1024-token viewport, at ~4 characters a token
MAX_RESULTS = 20
MAX_SESSIONS = 1024
MAX_PAGES = 1000
FIND_MAX_RESULTS = 50
FIND_SHOW_LINES = 4
_LINK = re.compile(r"【\d+†(?P<content>[^†】]+)(?:†[^†】]+)?】")


class BrowserError(Exception):
    """A call the browser cannot do; its message is what the model reads."""


@dataclass
class Page:
    url: str
    title: str
    text: str
    urls: dict[str, str]
    # Link id -> the line it points at (find results); search and find pages are listings.
    lines_of_links: dict[str, int] | None = None
    listing: bool = False


@dataclass(frozen=True)
class Display:
    """What one call shows (`text`, what the model reads) and, for clients, what it is: the
    page's cursor, URL and title, and a search's result URLs in rank order."""

    text: str
    cursor: int
    url: str
    title: str
    sources: tuple[str, ...] = ()

    def fields(self) -> dict[str, object]:
        fields: dict[str, object] = {"cursor": self.cursor, "url": self.url, "title": self.title}
        return fields | ({"sources": list(self.sources)} if self.url == "" else {})


def wrap_lines(text: str, width: int = 80) -> list[str]:
    wrapped: list[str] = []
    for line in text.split("\n"):
        wrapped.extend(
            textwrap.wrap(line, width=width, replace_whitespace=False, drop_whitespace=False)
            if line
            else [""]
        )
    return wrapped


class Session:
    """One conversation's page stack: a cursor is an index into it."""

    def __init__(self) -> None:
        self.pages: list[Page] = []

    def page(self, cursor: int = -1) -> Page:
        if not self.pages:
            raise BrowserError("No pages to access!")
        if cursor == -1:
            return self.pages[-1]
        if not 0 <= cursor < len(self.pages):
            raise BrowserError(
                f"Cursor `{cursor}` is out of range. "
                f"Available cursor indices: [0 - {len(self.pages) - 1}]."
            )
        return self.pages[cursor]

    def push(self, page: Page) -> int:
        if len(self.pages) >= MAX_PAGES:
            raise BrowserError(f"This session has {MAX_PAGES} pages open: start a new one.")
        self.pages.append(page)
        return len(self.pages) - 1


def document_page(document: Document, view_source: bool = False) -> Page:
    if view_source:
        source = document.source_path.read_text(encoding="utf-8", errors="replace")
        return Page(f"view-source:{document.url}", document.page.title, source, urls={})
    text = f"\nURL: {document.url}\n" + document.page.text
    return Page(document.url, document.page.title, text, dict(document.page.urls))


class Browser:
    """The browser's sessions (by key, least recently used dropped first) over one folder."""

    def __init__(self, folder: DocumentFolder, view_chars: int = VIEW_CHARS) -> None:
        self.folder = folder
        self.view_chars = view_chars
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def session(self, key: str) -> Session:
        session = self._sessions.pop(key, None) or Session()
        self._sessions[key] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def search(self, key: str, query: str, topn: int = 10) -> Display:
        hits = self.folder.search(query, max(1, min(topn, MAX_RESULTS)))
        items = []
        for hit in hits:
            title = hit.document.page.title.replace("†", "‡")
            items.append(f"  * 【{len(items)}†{title}†{_domain(hit.document.url)}】 {hit.snippet}")
        listing = "\n".join(items) if items else f"No results for `{query}`."
        page = Page(
            url="",
            title=query,
            text=f"\nURL: \n# Search Results\n\n{listing}",
            urls={str(i): hit.document.url for i, hit in enumerate(hits)},
            listing=True,
        )
        return self._show_new(self.session(key), page, loc=0, num_lines=-1)

    def open(
        self,
        key: str,
        id: int | str = -1,
        cursor: int = -1,
        loc: int = -1,
        num_lines: int = -1,
        view_source: bool = False,
    ) -> Display:
        session = self.session(key)
        line_of_link: int | None = None
        if isinstance(id, str):
            page = self._fetch(id, view_source)
        else:
            current = session.page(cursor)
            if id >= 0:
                url = current.urls.get(str(id))
                if url is None:
                    raise BrowserError(f"Invalid link id `{id}`.")
                line_of_link = (current.lines_of_links or {}).get(str(id))
                page = self._fetch(url, view_source)
            elif view_source:
                page = self._fetch(current.url, True)
            else:
                page = current
        if loc < 0:
            loc = _view_start(line_of_link)
        return self._show_new(session, page, loc=loc, num_lines=num_lines)

    def find(self, key: str, pattern: str, cursor: int = -1) -> Display:
        session = self.session(key)
        page = session.page(cursor)
        if page.listing:
            raise BrowserError("Cannot run `find` on search results page or find results page")
        return self._show_new(session, find_in_page(pattern, page), loc=0, num_lines=-1)

    def _fetch(self, url: str, view_source: bool) -> Page:
        document = self.folder.find(url.removeprefix("view-source:"))
        if document is None:
            raise BrowserError(f"Error fetching URL `{_truncate(url)}`: not in the document folder")
        return document_page(document, view_source or url.startswith("view-source:"))

    def _show_new(self, session: Session, page: Page, loc: int, num_lines: int) -> Display:
        """Push the page and show it; a display that fails leaves the stack as it was."""
        cursor = session.push(page)
        try:
            text = self.display(page, cursor, loc, num_lines)
        except BrowserError:
            session.pages.pop()
            raise
        sources = tuple(page.urls.values()) if page.url == "" and page.listing else ()
        return Display(text, cursor, page.url, page.title, sources)

    def display(self, page: Page, cursor: int, loc: int, num_lines: int) -> str:
        lines = wrap_lines(page.text)
        total = len(lines)
        if loc >= total:
            raise BrowserError(
                f"Invalid location parameter: `{loc}`. Cannot exceed page maximum of {total - 1}."
            )
        end = min(loc + num_lines, total) if num_lines > 0 else self._viewport_end(lines, loc)
        body = "\n".join(f"L{i}: {lines[i]}" for i in range(loc, end))
        header = page.title + (f" ({_truncate(page.url)})" if page.url else "")
        scrollbar = f"viewing lines [{loc} - {end - 1}] of {total - 1}"
        return f"[{cursor}] {header}\n**{scrollbar}**\n\n{body}"

    def _viewport_end(self, lines: list[str], loc: int) -> int:
        """The first line past a viewport of about `view_chars` characters (one line at least)."""
        used = 0
        for index in range(loc, len(lines)):
            used += len(lines[index]) + len(f"L{index}: \n")
            if used > self.view_chars and index > loc:
                return index
        return len(lines)


def find_in_page(pattern: str, page: Page) -> Page:
    """The find results page: each match with the lines after it, a link to its place."""
    lines = _LINK.sub(lambda m: m.group("content"), "\n".join(wrap_lines(page.text))).split("\n")
    needle = pattern.lower()
    chunks: list[str] = []
    lines_of_links: dict[str, int] = {}
    index = 0
    while index < len(lines) and len(chunks) < FIND_MAX_RESULTS:
        if needle not in lines[index].lower():
            index += 1
            continue
        shown = "\n".join(lines[index : index + FIND_SHOW_LINES])
        chunks.append(f"# 【{len(chunks)}†match at L{index}】\n{shown}")
        lines_of_links[str(len(chunks) - 1)] = index
        index += FIND_SHOW_LINES
    return Page(
        url=f"{page.url}/find?pattern={quote(pattern)}",
        title=f"Find results for text: `{pattern}` in `{page.title}`",
        text="\n\n".join(chunks) if chunks else f"No `find` results for pattern: `{pattern}`",
        urls={link: page.url for link in lines_of_links},
        lines_of_links=lines_of_links,
        listing=True,
    )


def _view_start(line_of_link: int | None) -> int:
    """Where a link opens: a find result's a few lines above its match, any other at the top."""
    if line_of_link is None:
        return 0
    return line_of_link - 4 if line_of_link > 4 else line_of_link


def _domain(url: str) -> str:
    return url.split("/")[2] if url.count("/") >= 2 else url


def _truncate(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
