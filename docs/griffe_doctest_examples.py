"""A Griffe extension for the API reference: ``Example:`` sections render as doctest code.

rppo_td's docstrings title their doctests ``Example:`` (Google style, accepted by ruff's
pydocstyle rules). Griffe's Google parser only knows the plural ``Examples:`` as a section,
and renders the singular as a plain admonition whose ``>>>`` lines Markdown reads as nested
quotes. This extension renames the title before parsing, so the examples come out as
highlighted code; the docstrings themselves are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class DoctestExamples(griffe.Extension):
    """Renames ``Example:`` sections to ``Examples:`` on every loaded object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrites the docstring of ``obj`` in place, if it has one."""
        docstring = obj.docstring
        if docstring is not None:
            docstring.value = _SINGULAR.sub(r"\g<indent>Examples:", docstring.value)
