"""The code blocks of a documentation page, keyed by the file name each one names in its first
line (``# my_engine_adapter.py``), so tests run a page's examples exactly as written.

Must NOT import torch, the engine or pytest.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

__all__ = ["code_blocks"]

_FENCE = re.compile(r"```(?:python|toml)\n(.*?)```", flags=re.S)
_NAME = re.compile(r"#\s*(\S+)")


def code_blocks(page: str | Path) -> dict[str, str]:
    """``{name: code}`` for every python or toml block whose first line is a ``# name`` comment."""
    blocks = {}
    for body in _FENCE.findall(Path(page).read_text(encoding="utf-8")):
        body = textwrap.dedent(body)
        match = _NAME.match(body.splitlines()[0]) if body.strip() else None
        if match:
            blocks[match.group(1)] = body
    return blocks
