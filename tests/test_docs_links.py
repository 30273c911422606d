"""Every relative link of README.md and docs/*.md resolves: the file exists and, with an anchor,
the heading it names is there (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# [text](target), not an image's; the target up to whitespace or the closing parenthesis.
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings: lowercased, punctuation dropped, spaces as ``-``, a
    repeated one suffixed ``-1``, ``-2``, ..."""
    found: set[str] = set()
    for line in prose(text):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
        candidate, count = slug, 0
        while candidate in found:
            count += 1
            candidate = f"{slug}-{count}"
        found.add(candidate)
    return found


def broken_links(document: Path) -> list[str]:
    """The relative links of ``document`` that do not resolve, each with why."""
    broken = []
    for line in prose(document.read_text(encoding="utf-8")):
        # Inline code is not a link.
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a URL (https:, mailto:)
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and \
                    anchor not in anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    assert broken_links(document) == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Quorum lost: from a backup\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Twice\n\n## Twice\n\n"
                    "[a](other.md#quorum-lost-from-a-backup) [b](#twice-1) [c](#page)\n"
                    "[d](missing.md) [e](other.md#nowhere) [f](#twice-2) `[g](nothing.md)`\n"
                    "```\n[h](inside-a-fence.md)\n```\n[i](https://example.org/x.md)\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nowhere: no heading #nowhere in other.md",
                                  "#twice-2: no heading #twice-2 in page.md"]
