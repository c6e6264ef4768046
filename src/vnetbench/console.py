"""The one way text reaches the operator's terminal: a rich Console that lets no control character through.

What vnetbench prints comes partly from others: process names read from /proc (the machine-load note), a remote
host's facts and lock lines, tool output, and every string of a results database someone else may have written.
An escape sequence in any of them could clear the screen, retitle the window, hide lines or fake a prompt, and
rich strips BEL, BS and CR but not ESC. So every segment rich renders, after layout and whatever its source, has
its C0 and C1 control characters (all but line feed and tab), DEL and the bidirectional overrides replaced by
a visible ``\\x1b``-style escape; rich's own cursor and style codes are kept. Markup is the call sites' part:
text from outside is passed through ``rich.markup.escape`` (or as ``Text``), so that ``[/x]`` in a name is text.

Standard output that is not a terminal (``export > file.csv``, ``| jq``) is data and is left byte-exact;
JSON escapes control characters itself.
"""

from __future__ import annotations

import re
import sys
from typing import IO, Any, Iterable

from rich.console import Console
from rich.errors import MarkupError
from rich.segment import Segment
from rich.text import Text

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str) -> str:
    """`text` with every character that could act on a terminal written out as an escape (``\\x1b``)."""
    return _UNSAFE.sub(_shown, text)


class SafeConsole(Console):
    """A rich Console whose output holds no control character of anyone's text (see the module docstring), and
    that prints a line whose markup does not parse as the text it is, rather than fail: a call site that missed
    an escape costs the line its colours, not the command (``[/x]`` in a run's name crashed `runs`)."""

    def render_str(self, text: str, *args: Any, **kwargs: Any) -> Text:
        try:
            return super().render_str(text, *args, **kwargs)
        except MarkupError:
            return super().render_str(text, *args, **{**kwargs, "markup": False})

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(clean(segment.text), segment.style)
            for segment in buffer)


class TerminalText:
    """A text stream for data (CSV) that cleans what it writes when, and only when, it is a terminal."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stdout
        self.terminal = self.stream.isatty()

    def write(self, text: str) -> int:
        return self.stream.write(clean(text) if self.terminal else text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
