"""gpt-oss's browser tool over a document folder, through the `mcp` SDK's client against the
running reference tool server: what search finds, and the displays of open and find as the
model reads them (cursor, title, URL, scrollbar, numbered lines, link marks)."""

from __future__ import annotations

import re

from tests.support.toolserver import ToolServer, mcp_session, text_of

ZEBRA_URL = "http://docs.local/notes/zebra.md"


async def test_search_ranks_the_document_that_answers_first(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        query = "replica autoscaler target_ongoing_requests"
        result = await session.call_tool("search", {"query": query})
        shown = text_of(result)
    assert not result.is_error
    assert shown.startswith(f"[0] {query}\n**viewing lines [0 - ")
    results = re.findall(r"【(\d+)†([^†】]+)†docs\.local】", shown)
    # Both say "replica"; only one says the rarer words too.
    assert results == [("0", "Ray Serve autoscaling"), ("1", "Prefix-affinity routing")]
    assert "Zebras" not in shown  # not a word of the query in it
    assert "L2: # Search Results" in shown


async def test_search_leaves_out_hidden_files_and_links_out_of_the_folder(
    server: ToolServer,
) -> None:
    async with mcp_session(server.mcp_url) as session:
        for query in ("hiddenterm", "outsideterm"):
            shown = text_of(await session.call_tool("search", {"query": query}))
            assert f"No results for `{query}`." in shown
        opened = await session.call_tool("open", {"id": "http://docs.local/linked.txt"})
    assert opened.is_error
    assert "Error fetching URL `http://docs.local/linked.txt`" in text_of(opened)


async def test_open_by_url_shows_the_page_as_gpt_oss_reads_it(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        shown = text_of(await session.call_tool("open", {"id": ZEBRA_URL}))
    assert shown == (
        f"[0] Zebras ({ZEBRA_URL})\n"
        "**viewing lines [0 - 4] of 4**\n\n"
        "L0: \n"
        f"L1: URL: {ZEBRA_URL}\n"
        "L2: # Zebras\n"
        "L3: \n"
        "L4: Zebras have black and white stripes."
    )


async def test_open_a_result_then_a_link_on_its_page(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        await session.call_tool("search", {"query": "routing kv cache replica", "topn": 3})
        search_page = text_of(await session.call_tool("find", {"pattern": "x", "cursor": 0}))
        routing = text_of(await session.call_tool("open", {"id": 0, "cursor": 0}))
        autoscaling = text_of(await session.call_tool("open", {"id": 0}))
    assert "Cannot run `find` on search results page" in search_page
    assert routing.startswith("[1] Prefix-affinity routing (http://docs.local/routing.html)\n")
    assert "KV cache" in routing
    assert "SECRET_SCRIPT_TEXT" not in routing  # a script is no text of the page
    assert "color" not in routing  # nor a style
    assert "【0†autoscaling】" in routing  # a link in the folder: its id and text
    assert "【1†rings†example.com】" in routing  # a link out of it names its site
    assert autoscaling.startswith("[2] Ray Serve autoscaling (http://docs.local/ray-serve.md)\n")


async def test_the_viewport_and_scrolling_by_loc_and_num_lines(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        first = text_of(await session.call_tool("open", {"id": "harmony.txt"}))
        scrolled = text_of(await session.call_tool("open", {"loc": 200, "num_lines": 3}))
        beyond = await session.call_tool("open", {"cursor": 0, "loc": 900})
    last_shown = int(re.search(r"viewing lines \[0 - (\d+)\] of 301", first).group(1))
    assert 20 < last_shown < 300  # a viewport, not the whole page
    assert scrolled.startswith("[1] harmony (http://docs.local/harmony.txt)\n")
    assert "**viewing lines [200 - 202] of 301**" in scrolled
    assert re.findall(r"^L(\d+): ", scrolled, re.MULTILINE) == ["200", "201", "202"]
    assert beyond.is_error
    assert "Invalid location parameter: `900`. Cannot exceed page maximum of 301." in text_of(
        beyond
    )


async def test_find_then_open_a_match(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        await session.call_tool("open", {"id": "harmony.txt"})
        found = text_of(await session.call_tool("find", {"pattern": "NEEDLE-7391"}))
        opened = text_of(await session.call_tool("open", {"id": 0}))
        missing = text_of(await session.call_tool("find", {"pattern": "nowhere", "cursor": 0}))
    # The page's line 152 (two header lines before the file's line 150) holds the match.
    assert found.startswith(
        "[1] Find results for text: `NEEDLE-7391` in `harmony` "
        "(http://docs.local/harmony.txt/find?pattern=NEEDLE-7391)\n"
    )
    assert "L0: # 【0†match at L152】\nL1: The special word needle-7391 is on this line." in found
    assert "**viewing lines [148 - " in opened  # a few lines above the match
    assert "L152: The special word needle-7391" in opened
    assert "No `find` results for pattern: `nowhere`" in missing


async def test_a_bad_call_is_an_error_result_the_model_reads(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        nothing_open = await session.call_tool("open", {"id": 3})
        await session.call_tool("open", {"id": ZEBRA_URL})
        bad_link = await session.call_tool("open", {"id": 9})
        bad_cursor = await session.call_tool("find", {"pattern": "a", "cursor": 5})
    assert nothing_open.is_error and "No pages to access!" in text_of(nothing_open)
    assert bad_link.is_error and "Invalid link id `9`." in text_of(bad_link)
    assert bad_cursor.is_error
    assert "Cursor `5` is out of range. Available cursor indices: [0 - 0]." in text_of(bad_cursor)


async def test_pages_belong_to_the_x_session_id_across_connections(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url, {"x-session-id": "conversation-a"}) as session:
        await session.call_tool("search", {"query": "zebras stripes"})
    async with mcp_session(server.mcp_url, {"x-session-id": "conversation-a"}) as session:
        same = text_of(await session.call_tool("open", {"id": 0}))
    async with mcp_session(server.mcp_url, {"x-session-id": "conversation-b"}) as session:
        other = await session.call_tool("open", {"id": 0})
    assert same.startswith(f"[1] Zebras ({ZEBRA_URL})")
    assert other.is_error and "No pages to access!" in text_of(other)


async def test_structured_content_says_which_page_and_a_searchs_sources(
    server: ToolServer,
) -> None:
    async with mcp_session(server.mcp_url) as session:
        query = "replica autoscaler target_ongoing_requests"
        searched = await session.call_tool("search", {"query": query})
        opened = await session.call_tool("open", {"id": 1})
    assert searched.structured_content == {
        "cursor": 0,
        "url": "",
        "title": query,
        "sources": ["http://docs.local/ray-serve.md", "http://docs.local/routing.html"],
    }
    assert opened.structured_content == {
        "cursor": 1,
        "url": "http://docs.local/routing.html",
        "title": "Prefix-affinity routing",
    }
