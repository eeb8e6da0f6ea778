"""How long a piece harmony's tokenizer would have to merge, found before it is asked to.

o200k's pre-tokenizer cuts text into pieces (a run of letters, of punctuation, of whitespace,
digits by threes), and byte-pair merging within one piece takes time quadratic in its length,
in Rust, holding the GIL: one run of a single character costs 32 ms at 10 kB, 0.3 s at 30 kB,
3.4 s at 100 kB and 16 s at 200 kB, during which the process rendering it serves nothing (the
same lengths in words: 45 ms; a large request renders in a worker process, not on the ingress's
event loop: serve_app/serving/turn/render_pool.py). A request body may hold 16 MiB. So the door
turns away text holding a piece longer than `MAX_PIECE_CHARS` (20,000 characters, about 0.13 s)
before rendering.

`long_piece` bounds a piece's length from above without running the pre-tokenizer: a piece
never spans whitespace and digits (but for one leading space), so only a whitespace-free run
over the limit, between digits, is looked at character by character, for where letters and
marks meet punctuation and symbols; a run of whitespace is one piece. A run without whitespace
or digits of more than `MAX_RUN_CHARS` is turned away as it is: it is no natural text, and
looking into it would cost the time this guards. Text of at most `MAX_PIECE_CHARS` costs one
length check (16 MB of prose: about 0.3 s).
"""

from __future__ import annotations

import re
import unicodedata

MAX_PIECE_CHARS = 20_000
MAX_RUN_CHARS = 4 * MAX_PIECE_CHARS
_LONG_SPACE = re.compile(rf"\s{{{MAX_PIECE_CHARS + 1},}}")
_DIGITS = re.compile(r"\d+")


def long_piece(text: str) -> int:
    """The length of a piece (or of a run that would hold one) longer than `MAX_PIECE_CHARS` in
    ``text``; 0 if there is none. Only text longer than that is looked into at all."""
    if len(text) <= MAX_PIECE_CHARS:
        return 0
    spaces = _LONG_SPACE.search(text)
    if spaces is not None:
        return len(spaces.group())
    for word in text.split():
        if len(word) <= MAX_PIECE_CHARS:
            continue
        for run in _DIGITS.split(word):
            if len(run) > MAX_RUN_CHARS:
                return len(run)
            if len(run) > MAX_PIECE_CHARS:
                longest = _longest_same_class(run)
                if longest > MAX_PIECE_CHARS:
                    return longest
    return 0


def _longest_same_class(run: str) -> int:
    """The longest stretch of ``run`` (no whitespace, no ASCII digits) whose characters are all
    letters or marks, or all something else: where one pre-tokenized piece can reach. Other
    numbers (category N) are cut by threes, as digits are."""
    longest = length = 0
    previous = ""
    for char in run:
        kind = unicodedata.category(char)[0]
        kind = "L" if kind in "LM" else kind if kind == "N" else "P"
        if kind == previous and kind != "N":
            length += 1
        else:
            length, previous = 1, kind
        longest = max(longest, length)
    return longest
