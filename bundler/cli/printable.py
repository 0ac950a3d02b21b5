"""Make text from outside safe to print on a terminal: control characters written out.

Registry error messages, image config values and names from images reach the user's terminal;
an escape sequence in them must not move the cursor, set the title or hide text. Lean (only
``re``): both command lines use it, the importer without typer or rich.
"""

from __future__ import annotations

import re

# C0 controls but newline and tab, DEL, C1 controls, and the bidirectional overrides and
# isolates that reorder what a terminal shows
_UNPRINTABLE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def sanitize(text: str) -> str:
    r"""``text`` with control characters written out (``\x1b``), safe to print on a terminal."""
    return _UNPRINTABLE_RE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                          else f"\\u{ord(m.group()):04x}"), text)
