"""README and docs: every relative link points at a file that exists, and the
course index reaches every docs page and every numbered demo."""
import pathlib
import re

import pytest

pytestmark = pytest.mark.host_only  # text and source files: no backend array (tests/conftest.py)

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


# -- figures: each page shows one, drawn by the demo it names -------------------------------
FIGURE = re.compile(r"!\[[^\]]+\]\(figures/([^)\s]+\.png)\)")
NO_FIGURE = {"index.md", "cost_models.md",      # the course map; formulas without a demo;
             "running.md",                    # what the launcher prints
             "exercises.md"}                  # the learner's own work


def _make_figures():
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_figures", REPO / "docs" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)               # defines the table; runs nothing
    return module


def test_every_page_embeds_a_figure_that_exists():
    missing = []
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name in NO_FIGURE:
            continue
        figures = FIGURE.findall(page.read_text())
        if not figures:
            missing.append(f"{page.name}: no ![caption](figures/NAME.png)")
        missing += [f"{page.name}: {f} not in docs/figures/" for f in figures
                    if not (REPO / "docs" / "figures" / f).exists()]
    assert not missing, "\n".join(missing)


def test_make_figures_knows_the_demo_behind_every_figure_and_the_page_names_it():
    table = _make_figures().FIGURES
    problems = []
    for page in sorted((REPO / "docs").glob("*.md")):
        text = page.read_text()
        for figure in FIGURE.findall(text):
            if figure not in table:
                problems.append(f"{page.name}: {figure} is not in make_figures.FIGURES")
                continue
            demo = table[figure][0]
            if not (REPO / "demos" / demo).exists():
                problems.append(f"{figure}: demo {demo} does not exist")
            if f"demos/{demo}" not in text:
                problems.append(f"{page.name} shows {figure} but never names demos/{demo}")
    assert not problems, "\n".join(problems)


def test_every_figure_in_the_table_is_committed_and_every_demo_draws_one():
    table = _make_figures().FIGURES
    on_disk = {p.name for p in (REPO / "docs" / "figures").glob("*.png")}
    assert set(table) == on_disk, f"table only: {set(table) - on_disk}, disk only: {on_disk - set(table)}"
    for demo, _, _ in table.values():
        assert "--figure" in (REPO / "demos" / demo).read_text(), demo


# -- the source documents: cited, never shipped, defined once in the index ------------------
SOURCE_DEFINITION = "index.md#the-source-documents"
CITES_SOURCES = re.compile(r"workbook|source documents?|worked solutions|\bquiz\b|"
                           r"\bexercise (?:26|35)\.\d+|\bch26\b", re.IGNORECASE)


def test_the_index_defines_the_source_documents():
    index = (REPO / "docs" / "index.md").read_text()
    assert "\n## The source documents\n" in index
    for numbering in ("workbook 5.4", "exercise 26.10", "exercise 35.2", "quiz Q5",
                      "worked solutions"):
        assert numbering in index, f"docs/index.md does not say what {numbering!r} refers to"


def test_every_page_that_cites_the_source_documents_links_their_definition():
    undefined = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if page.name == "index.md":
            continue
        text = page.read_text()
        cited = CITES_SOURCES.search(text)
        if cited and SOURCE_DEFINITION not in text:
            line = text[:cited.start()].count("\n") + 1
            undefined.append(f"{page.relative_to(REPO)}:{line}: {cited[0]!r} without a link "
                             f"to {SOURCE_DEFINITION}")
    assert not undefined, "\n".join(undefined)


def test_the_index_times_every_demo_as_docs_time_demos_measures_them():
    """docs/index.md's table of demo times has a row for each demo, and the script
    that measures them runs each at its defaults."""
    index = (REPO / "docs" / "index.md").read_text()
    section = index.split("## How long the demos take", 1)[1].split("\n## ", 1)[0]
    assert "python docs/time_demos.py" in section
    demos = sorted(p.stem for p in (REPO / "demos").glob("[0-9][0-9]_*.py"))
    missing = [d for d in demos if f"| {d} | " not in section]
    assert not missing, f"no time in docs/index.md for {missing}: run python docs/time_demos.py"
