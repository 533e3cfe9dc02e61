"""mkdocs hooks: the docstrings' Sphinx roles (``:class:`Keys```) read as plain code.

The package's docstrings are Google style with a few Sphinx cross-reference roles, which
mkdocstrings renders as ``:class:<code>Keys</code>``. This drops the role, and the module
path of a ``~``-prefixed target, as Sphinx shows them; a paragraph ending in reST's ``::``
(before an example) ends in one colon.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):<code>(~?)([^<]+)</code>")


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    """Rewrites the roles in a page's HTML, and the ``::`` that opens a reST literal block."""
    return _ROLE.sub(_code, html).replace("::</p>", ":</p>")
