"""The documentation: the MkDocs site builds strictly, every page is in its nav, README's links resolve.

`mkdocs build --strict` with mkdocs.yml's `validation:` options fails on a link to a missing page,
a missing #anchor or a page left out of nav; the tests below also show it does. README.md is
outside the site (it is read on a forge or in an editor), so its relative links are checked here:
each file must exist and each #anchor must be a heading of the target as both GitHub and MkDocs
name it (the link works in the repository and in the built site).
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from markdown.extensions.toc import slugify as mkdocs_slugify

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 150

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), not an image
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _drafts(path: Path) -> bool:
    """Whether a docs page is a feature's draft (`pending-*.md`), kept out of the site until merged."""
    return path.name.startswith("pending-")


def _outside_fences(text: str) -> list[str]:
    """The lines of a Markdown text that are not inside a fenced code block.

    Args:
        text: Markdown source.
    """
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _plain(heading: str) -> str:
    """A heading's text as rendered: links by their text, no code or emphasis marks."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return heading.replace("`", "").replace("*", "")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to hyphens).

    Args:
        heading: the heading's Markdown text, without the leading #s.
    """
    text = _plain(heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> dict[str, set[str]]:
    """Each heading's anchor in a Markdown file, as GitHub and as MkDocs name it.

    Args:
        path: a Markdown file.

    Returns:
        {"github": anchors, "mkdocs": anchors} (a repeated heading's later anchors included).
    """
    out: dict[str, set[str]] = {"github": set(), "mkdocs": set()}
    seen: dict[str, dict[str, int]] = {"github": {}, "mkdocs": {}}
    for line in _outside_fences(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        for kind, slug in (("github", github_slug(m.group(2))),
                           ("mkdocs", mkdocs_slugify(_plain(m.group(2)), "-"))):
            n = seen[kind].get(slug, 0)
            seen[kind][slug] = n + 1
            out[kind].add(slug if n == 0 else f"{slug}{'-' if kind == 'github' else '_'}{n}")
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a Markdown file whose file or #anchor does not exist.

    Args:
        path: a Markdown file; its links are taken relative to its folder.
        root: the repository; a link that leaves it is broken.

    Returns:
        One line per broken link, naming the link and what is missing.
    """
    broken = []
    for line in _outside_fences(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{target}: no file {dest}")
                continue
            if root.resolve() not in dest.parents:
                broken.append(f"{target}: outside the repository")
                continue
            if anchor:
                if dest.suffix != ".md":
                    broken.append(f"{target}: an anchor into a file that is not Markdown")
                    continue
                found = anchors(dest)
                missing = [k for k in ("github", "mkdocs") if anchor not in found[k]]
                if missing:
                    broken.append(f"{target}: no heading #{anchor} in {dest.name} "
                                  f"(as {' and '.join(missing)} name headings)")
    return broken


def nav_pages(config: Path) -> list[str]:
    """Every page named in a mkdocs.yml's nav, in order.

    Args:
        config: a mkdocs.yml.
    """
    pages: list[str] = []

    def walk(node):
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(yaml.safe_load(config.read_text(encoding="utf-8"))["nav"])
    return pages


def _build(project: Path, site: Path) -> subprocess.CompletedProcess:
    """Runs `mkdocs build --strict` on a project's mkdocs.yml into `site`."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(project / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, timeout=300)


def _copy_project(tmp_path: Path) -> Path:
    """A copy of docs/ and mkdocs.yml under `tmp_path`, to break on purpose."""
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    return project


def test_site_builds_strictly_with_no_broken_link(tmp_path):
    r = _build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "figures" / "index.html").exists()


def test_built_site_is_git_ignored():
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()
    assert yaml.safe_load((ROOT / "mkdocs.yml").read_text())["site_dir"] == "site"


def test_strict_build_fails_on_a_broken_anchor_a_missing_page_and_a_page_not_in_nav(tmp_path):
    project = _copy_project(tmp_path)
    with (project / "docs" / "params.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [the rules](measurement-rules.md#no-such-rule) and [gone](gone.md).\n")
    (project / "docs" / "orphan.md").write_text("# A page nobody listed\n")
    r = _build(project, tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "no-such-rule" in out and "gone.md" in out and "orphan.md" in out


def test_a_draft_page_is_left_out_of_the_site_until_merged(tmp_path):
    project = _copy_project(tmp_path)
    (project / "docs" / "pending-feature.md").write_text("# A feature, merged by hand later\n")
    r = _build(project, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "site" / "pending-feature").exists()


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    pages = nav_pages(ROOT / "mkdocs.yml")
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if not _drafts(p)}
    assert sorted(set(pages)) == sorted(pages), "a page is listed twice in nav"
    assert on_disk - set(pages) == set(), "pages in docs/ missing from mkdocs.yml's nav"
    assert set(pages) - on_disk == set(), "nav entries with no page in docs/"
    assert pages[0] == "index.md"


def test_readme_relative_links_resolve_to_files_and_headings():
    readme = ROOT / "README.md"
    links = [t for line in _outside_fences(readme.read_text()) for t in _LINK.findall(line)]
    assert any("#" in t and t.startswith("docs/") for t in links)  # anchors are checked, not none
    assert broken_links(readme) == []


def test_readme_links_every_page_of_the_site():
    text = (ROOT / "README.md").read_text()
    linked = {t.partition("#")[0] for t in _LINK.findall(text)}
    unlinked = [p for p in nav_pages(ROOT / "mkdocs.yml")
                if p != "index.md" and f"docs/{p}" not in linked]
    assert unlinked == []


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/"


def test_link_checker_finds_a_missing_file_a_missing_anchor_and_a_path_outside(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "page.md").write_text(
        "# Page\n\n## One fix, several speedups\n\n```bash\n# not a heading\n```\n")
    (tmp_path / "elsewhere.md").write_text("# Elsewhere\n")
    readme = repo / "README.md"
    readme.write_text("# Readme\n\n[ok](docs/page.md#one-fix-several-speedups) [top](#readme)\n"
                      "[web](https://example.org/x#y) [file](docs/missing.md)\n"
                      "[anchor](docs/page.md#not-a-heading) [out](../elsewhere.md)\n")
    broken = broken_links(readme, repo)
    assert [b.split(":")[0] for b in broken] == ["docs/missing.md", "docs/page.md#not-a-heading",
                                                 "../elsewhere.md"]
    readme.write_text("# Readme\n\n[ok](docs/page.md#one-fix-several-speedups) [top](#readme)\n")
    assert broken_links(readme, repo) == []


def test_heading_anchors_as_github_and_mkdocs_name_them(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# The fix, as an API\n\n## Verified on a GPU / not yet\n\n"
                    "## `make docs` and the site\n\n## `--resume`\n\n## Setup\n\n## Setup\n")
    found = anchors(page)
    assert {"the-fix-as-an-api", "make-docs-and-the-site", "setup"} <= found["github"] & found["mkdocs"]
    assert "--resume" in found["github"] and "-resume" in found["mkdocs"]
    # GitHub keeps both hyphens around a dropped "/", MkDocs merges them: a link must avoid it
    assert "verified-on-a-gpu--not-yet" in found["github"] - found["mkdocs"]
    assert "verified-on-a-gpu-not-yet" in found["mkdocs"] - found["github"]
    assert "setup-1" in found["github"] and "setup_1" in found["mkdocs"]
