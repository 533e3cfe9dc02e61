"""The built documentation site (``make docs`` builds ``site/``) draws its diagrams offline.

Mermaid comes from npm with the site (``assets/javascripts/mermaid.min.js``, fetched by the
Makefile), so no page asks a CDN for it: Material's bundle loads mermaid from unpkg only where no
``mermaid`` is defined yet, and the local script, a plain ``<script>`` before the page's end,
defines it. Skipped where no site was built (CI builds it before the tests).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _helpers import chromium, dump_dom

SITE = Path(__file__).resolve().parent.parent / "site"
MERMAID = "assets/javascripts/mermaid.min.js"

pytestmark = pytest.mark.skipif(
    not (SITE / "index.html").exists(), reason="no built site: `make docs` builds site/"
)

_CDN = re.compile(r"(?:unpkg\.com|jsdelivr\.net|cdnjs\.cloudflare\.com)[^\"'\s]*mermaid", re.I)
_SCRIPT = re.compile(r"<script(?P<attributes>[^>]*)\bsrc=\"(?P<src>[^\"]*mermaid[^\"]*)\"")


def _pages_with_diagrams() -> list[Path]:
    return sorted(p for p in SITE.rglob("*.html") if 'class="mermaid"' in p.read_text())


def test_no_page_loads_mermaid_from_a_cdn() -> None:
    pages = sorted(SITE.rglob("*.html"))
    assert pages
    from_cdn = [str(p.relative_to(SITE)) for p in pages if _CDN.search(p.read_text())]
    assert not from_cdn, f"pages that load mermaid from a CDN: {from_cdn}"


def test_every_page_with_a_diagram_loads_the_local_mermaid_first() -> None:
    pages = _pages_with_diagrams()
    assert pages, "no page of the site has a diagram"
    for page in pages:
        scripts = list(_SCRIPT.finditer(page.read_text()))
        assert len(scripts) == 1, f"{page.relative_to(SITE)}: {[s[0] for s in scripts]}"
        (script,) = scripts
        # Defined before Material mounts the page's diagrams: not deferred, not a module.
        assert not re.search(r"\b(?:async|defer|type=)", script["attributes"]), script[0]
        local = (page.parent / script["src"]).resolve()
        assert local == (SITE / MERMAID).resolve(), script["src"]
    text = (SITE / MERMAID).read_text()
    assert 'globalThis["mermaid"]' in text, f"{MERMAID} does not define the global mermaid"


@pytest.mark.skipif(
    chromium() is None, reason="headless Chromium is missing (make browser installs it)"
)
def test_the_diagrams_render_with_no_network() -> None:
    """In headless Chromium with every host name unresolvable, Material replaces each
    diagram's ``<pre class="mermaid">`` by the ``<div class="mermaid">`` it draws into once
    mermaid rendered it (a failed load leaves the ``pre``, without its class)."""
    for page in _pages_with_diagrams():
        diagrams = page.read_text().count('<pre class="mermaid">')
        done = dump_dom(
            page,
            "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no CDN to fall back on
            "--virtual-time-budget=15000",  # until the asynchronous rendering is done
        )
        drawn = done.stdout.count('<div class="mermaid">')
        assert drawn == diagrams, (
            f"{page.relative_to(SITE)}: {drawn} of {diagrams} diagrams drawn offline "
            f"(rc {done.returncode}): {done.stderr[-2000:]}"
        )
