"""Reports of validate, run, drift, health and preflight; `count` words their summaries."""


def count(n: int, noun: str) -> str:
    """`1 host`, `2 hosts`, `0 hosts` (the nouns of our summaries all take an s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
