"""A document as one text: its title, a line break, its text. The LLM stages prompt with it, and it is
the passage a generated query is matched to (negatives) and trained against (pairs)."""

from __future__ import annotations


def document_text(title: str | None, text: str) -> str:
    return f"{title}\n{text}" if title else text
