"""README and docs: every relative link points at a file that exists, and the
course index reaches every docs page and every numbered demo."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def _relative_links(page: pathlib.Path):
    for target, _ in LINK.findall(page.read_text()):
        if "://" not in target:
            yield target


def test_every_relative_link_resolves():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in _relative_links(page):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_index_reaches_every_page_and_demo():
    index = (REPO / "docs" / "index.md").read_text()
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    demos = {p.name for p in (REPO / "demos").glob("[0-9][0-9]_*.py")}
    missing = sorted(n for n in pages | demos if n not in index)
    assert not missing, f"docs/index.md does not link: {missing}"


def test_readme_points_to_the_index():
    assert "docs/index.md" in (REPO / "README.md").read_text()
