"""docs/walkthrough.md has the walkthrough's steps as ```sh blocks (the e2e suite runs them:
tests/e2e/test_walkthrough.py), and they read no variable the page does not document."""

from __future__ import annotations

import re

import pytest
from tests.e2e.support.walkthrough import PLACEHOLDERS, WALKTHROUGH, sh_blocks, variables

#: what each step must do, in this order (a substring of one of its blocks)
STEPS = (
    "helm upgrade --install podsnap charts/podsnap",
    "kind: SnapshotPolicy",
    "kubectl wait snapshotpolicy/worker",
    "podsnap status policy/worker",
    "kubectl scale deployment/worker",
    "--for=condition=podsnap.io/Restored=True",
    "/v1/chat/completions",
    'kubectl delete -n "$NAMESPACE" snapshotpolicy/worker',
)


def test_the_walkthrough_has_its_steps_as_sh_blocks_in_order() -> None:
    blocks = sh_blocks(WALKTHROUGH.read_text())
    assert len(blocks) >= 6, f"docs/walkthrough.md has {len(blocks)} ```sh blocks"
    text = "\n".join(b.script for b in blocks)
    where = [text.find(step) for step in STEPS]
    missing = [s for s, i in zip(STEPS, where, strict=True) if i < 0]
    assert not missing, f"docs/walkthrough.md's ```sh blocks lack {missing}"
    assert where == sorted(where), (
        f"docs/walkthrough.md's steps are out of order: {dict(zip(STEPS, where, strict=True))}"
    )


def test_the_blocks_read_only_documented_placeholders() -> None:
    text = WALKTHROUGH.read_text()
    for name in PLACEHOLDERS:
        assert f"`{name}`" in text, f"docs/walkthrough.md does not document ${name}"
    for block in sh_blocks(text):
        unknown = variables(block.script) - set(PLACEHOLDERS) - {"PATH", "PWD"}
        assert not unknown, f"{block} reads {sorted(unknown)}: set them in the block or document them"


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("```sh\necho a\n```\n", 1), ("```\necho a\n```\n```sh\nx\n```\n```bash\ny\n```\n", 1)],
)
def test_only_sh_fences_are_blocks(text: str, count: int) -> None:
    assert len(sh_blocks(text)) == count


def test_every_link_of_the_walkthrough_resolves() -> None:
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", WALKTHROUGH.read_text()) if not re.match(r"^[a-z]+:", t)]
    assert "troubleshooting.md" in links
    dead = sorted(t for t in links if not (WALKTHROUGH.parent / t.split("#")[0]).exists())
    assert not dead, f"docs/walkthrough.md links to files that do not exist: {dead}"
