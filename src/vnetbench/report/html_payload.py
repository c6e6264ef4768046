"""Blocks of the page that travel compressed: gzip, then base64, in ``<script type="application/json">``.

Where a report's bytes go (``bench/report.py`` prints it): at the demo's size
plotly.js is 93% of the page; with 200 configurations x 20 trials the chart
and series JSON is 7.2 MB of a 13.6 MB page. Both compress well (plotly.js
1.5 MB to 0.66 MB, the data to 4.1 MB, base64 included), so both are packed;
the page script unpacks them with the browser's standard
``DecompressionStream("gzip")``. The HTML itself (tables, text) stays plain:
it must read, print and be searched without any script.

A packed block is JSON, ``{"packed": "gzip+base64", "data": "H4sI..."}``,
written by :func:`vnetbench.report.html.json_for_script` like any other data,
so it stays inert inside its element; base64 has no ``<`` anyway. gzip runs
with mtime 0, so the same report is the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

PACKED = "gzip+base64"
#: gzip's best: 0.25 s for the 7 MB of the 200-configuration benchmark, 3% smaller than level 6.
LEVEL = 9


def pack(text: str) -> dict[str, str]:
    """``text`` (UTF-8) gzipped and base64-encoded, as the JSON object a page block carries."""
    raw = gzip.compress(text.encode("utf-8"), compresslevel=LEVEL, mtime=0)
    return {"packed": PACKED, "data": base64.b64encode(raw).decode("ascii")}


def unpack(block: Any) -> str:
    """The text of a block as :func:`pack` made it (or as JSON text of one); what the page script does."""
    if isinstance(block, str):
        block = json.loads(block)
    if not isinstance(block, dict) or block.get("packed") != PACKED:
        raise ValueError(f'not a packed block: expected {{"packed": "{PACKED}", "data": ...}}')
    return gzip.decompress(base64.b64decode(block["data"], validate=True)).decode("utf-8")
