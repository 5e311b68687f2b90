"""The docs site builds with MkDocs in strict mode, needs no network to be read, and the README's map
reaches every page of it.

`mkdocs build --strict` turns every warning into a failure, and mkdocs.yml's `validation` makes
warnings of a broken link or anchor between pages, a nav entry without its page and a page the nav
leaves out. The README is not part of the site (it is the repository's front page), so its links are
checked here against the files and the built pages' anchors. (The code blocks of every page run in
tests/test_readme.py.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: every page of the site, as a path from docs/
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
#: a Markdown link or image: [text](target) / ![alt](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: what a browser fetches by itself while showing a page: scripts, style sheets, images, frames
FETCHED = re.compile(r"<(?:script|img|iframe)\b[^>]*\bsrc=\"([^\"]+)\"|<link\b[^>]*\bhref=\"([^\"]+)\"", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    config = str(ROOT / "mkdocs.yml")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config, "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return out


def _built(site: Path, page: str) -> Path:
    """Where a page lands in the site (mkdocs' default directory URLs: docs/x.md -> x/index.html)."""
    stem = page.removesuffix(".md")
    return site / ("index.html" if stem == "index" else f"{stem}/index.html")


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    assert PAGES and "index.md" in PAGES
    missing = [p for p in PAGES if not _built(site, p).is_file()]
    assert not missing, f"pages not built: {missing}"


def test_the_site_fetches_nothing_from_the_network(site: Path) -> None:
    """No CDN: a page fetches its scripts, styles, fonts and images from the site itself, so the docs
    read offline (links a reader may click are fine)."""
    remote = {
        (html.relative_to(site).as_posix(), url)
        for html in site.rglob("*.html")
        for m in FETCHED.finditer(html.read_text(errors="replace"))
        if (url := m.group(1) or m.group(2)).startswith(("http:", "https:", "//"))
    }
    assert not remote, f"{len(remote)} resources fetched from elsewhere, e.g. {sorted(remote)[:5]}"


def test_the_readme_and_the_home_page_map_every_page() -> None:
    readme = set(LINK.findall((ROOT / "README.md").read_text()))
    home = set(LINK.findall((DOCS / "index.md").read_text()))
    pages = [p for p in PAGES if p != "index.md"]
    assert [p for p in pages if f"docs/{p}" not in readme] == [], "pages missing from the README's map"
    assert [p for p in pages if p not in home] == [], "pages missing from docs/index.md's map"


def test_the_readme_links_resolve(site: Path) -> None:
    """Every relative link and image of the README names a file that exists and, for a docs page with
    an anchor, a heading the built page has."""
    broken = []
    for target in LINK.findall((ROOT / "README.md").read_text()):
        if target.startswith(("http:", "https:")):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.startswith("docs/") and path.endswith(".md"):
            html = _built(site, path.removeprefix("docs/")).read_text()
            if f'id="{anchor}"' not in html:
                broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken
