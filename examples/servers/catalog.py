"""Catalog: a read-only book catalog whose tools are meant to be combined.

Search finds ids, details give the facts, filters narrow by numbers, and an aggregate computes
over a set of ids: "the mean price of Jules Verne's books" takes a search, then an aggregate.
The data ships beside this file (data/books.json).

    python examples/servers/catalog.py            # stdio
    python examples/servers/catalog.py --http 8003
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).parent))
from _compat import READS, ToolError, make_server, serve

_BOOKS = json.loads((Path(__file__).parent / "data" / "books.json").read_text("utf-8"))["books"]
_BY_ID = {b["id"]: b for b in _BOOKS}
Genre = Literal[
    "adventure",
    "fantasy",
    "historical fiction",
    "horror",
    "literary fiction",
    "mystery",
    "romance",
    "science fiction",
]
Field = Literal["price", "pages", "rating", "year", "in_stock"]

server = make_server(
    "catalog",
    instructions="A read-only catalog of classic books: search, details, filter, aggregate.",
)


def _brief(book: dict) -> dict:
    return {"id": book["id"], "title": book["title"], "author": book["author"]}


@server.tool(annotations=READS)
def search_books(query: str, limit: int = 10) -> dict:
    """Find books whose title or author contains every word of the query (case-insensitive).
    Returns ids, titles and authors."""
    words = query.lower().split()
    if not words:
        raise ToolError("query must contain at least one word")
    if not 1 <= limit <= 50:
        raise ToolError("limit must be between 1 and 50")
    hits = [b for b in _BOOKS if all(w in f"{b['title']} {b['author']}".lower() for w in words)]
    return {"count": len(hits), "books": [_brief(b) for b in hits[:limit]]}


@server.tool(annotations=READS)
def get_book(book_id: str) -> dict:
    """All details of one book: title, author, year, genre, pages, price (USD), rating (0-5) and
    copies in stock."""
    book = _BY_ID.get(book_id.strip().upper())
    if book is None:
        raise ToolError(f"no book with id {book_id!r}; ids look like 'B001' (use search_books)")
    return book


@server.tool(annotations=READS)
def filter_books(
    genre: Genre | None = None,
    min_year: int | None = None,
    max_year: int | None = None,
    max_price: float | None = None,
    min_rating: float | None = None,
    in_stock_only: bool = False,
) -> dict:
    """Books matching every condition given, oldest first. Returns ids, titles and authors."""
    hits = [
        b
        for b in sorted(_BOOKS, key=lambda b: (b["year"], b["id"]))
        if (genre is None or b["genre"] == genre)
        and (min_year is None or b["year"] >= min_year)
        and (max_year is None or b["year"] <= max_year)
        and (max_price is None or b["price"] <= max_price)
        and (min_rating is None or b["rating"] >= min_rating)
        and (not in_stock_only or b["in_stock"] > 0)
    ]
    return {"count": len(hits), "books": [_brief(b) for b in hits]}


@server.tool(annotations=READS)
def aggregate(book_ids: list[str], field: Field, op: Literal["sum", "mean", "min", "max"]) -> dict:
    """Compute sum, mean, min or max of a numeric field over the given books."""
    if not book_ids:
        raise ToolError("book_ids must list at least one id")
    missing = [i for i in book_ids if i.strip().upper() not in _BY_ID]
    if missing:
        raise ToolError(f"unknown book ids: {', '.join(missing)}")
    values = [_BY_ID[i.strip().upper()][field] for i in book_ids]
    fn = {"sum": sum, "mean": statistics.fmean, "min": min, "max": max}[op]
    return {"op": op, "field": field, "books": len(values), "value": round(fn(values), 2)}


@server.tool(annotations=READS)
def list_genres() -> dict:
    """Every genre in the catalog with its number of books."""
    counts: dict[str, int] = {}
    for b in _BOOKS:
        counts[b["genre"]] = counts.get(b["genre"], 0) + 1
    return {"genres": dict(sorted(counts.items()))}


@server.resource("catalog://about", mime_type="text/plain")
def about() -> str:
    """What the catalog holds."""
    authors = sorted({b["author"] for b in _BOOKS})
    return f"{len(_BOOKS)} classic books by {len(authors)} authors: {', '.join(authors)}."


if __name__ == "__main__":
    serve(server)
