"""docs/walkthrough.md as the e2e suite runs it: its ```sh blocks, in order, and the variables they may read.

Kept free of cluster imports: the unit suite reads the same blocks to check the page has them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
WALKTHROUGH = REPO / "docs" / "walkthrough.md"

#: the placeholders the page documents (its "Your settings" table): the only things a run substitutes
PLACEHOLDERS = ("KUBECONFIG", "VALUES", "DEMO_IMAGE", "NAMESPACE")

#: a fenced block opened by ```sh at the start of a line, up to the closing ``` line
SH_BLOCK = re.compile(r"^```sh[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
#: a block's step: the nearest heading above it
HEADING = re.compile(r"^#{1,6} +(.+?)\s*$", re.M)


@dataclass(frozen=True)
class Block:
    heading: str
    line: int  # 1-based line of the ```sh fence
    script: str

    def __str__(self) -> str:
        return f"docs/walkthrough.md:{self.line} ({self.heading})"


def sh_blocks(text: str) -> list[Block]:
    blocks = []
    for m in SH_BLOCK.finditer(text):
        headings = HEADING.findall(text[: m.start()])
        blocks.append(Block(headings[-1] if headings else "", text.count("\n", 0, m.start()) + 1, m.group(1)))
    return blocks


def variables(script: str) -> set[str]:
    """Shell variables a block reads ($NAME and ${NAME...}), less those it sets itself."""
    read = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", script))
    assigned = set(re.findall(r"(?:^|[\s;(])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", script, flags=re.M))
    return read - assigned
