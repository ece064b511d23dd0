"""The text chunks of a PNG file: a figure records the size of its smallest text, so a page
(and a test) can tell whether it stays legible at the size it is shown."""

from __future__ import annotations

import struct
import zlib

from matplotlib.figure import Figure
from matplotlib.text import Text

TEXT_PX_KEY = "sinkscope:min-text-px"  # PNG text chunk: the smallest text's size in image pixels


def smallest_text_pt(fig: Figure) -> float | None:
    """The font size in points of the smallest visible, non-empty text in ``fig``."""
    sizes = [
        float(text.get_fontsize())
        for text in fig.findobj(Text)
        if isinstance(text, Text) and text.get_visible() and text.get_text().strip()
    ]
    return min(sizes) if sizes else None


def with_text_chunk(png: bytes, key: str, value: str) -> bytes:
    """``png`` with a tEXt chunk ``key``=``value`` inserted before its IEND chunk."""
    iend = png.rindex(b"IEND") - 4  # the chunk starts with its 4-byte length
    body = b"tEXt" + key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return png[:iend] + chunk + png[iend:]


def png_text(png: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG file's bytes, e.g. ``TEXT_PX_KEY``."""
    found, offset = {}, 8
    while offset + 8 <= len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind = png[offset + 4 : offset + 8]
        if kind == b"tEXt":
            key, _, value = png[offset + 8 : offset + 8 + length].partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        offset += 12 + length
    return found
