"""A dependency-free PNG bar chart (zlib + a 5x7 bitmap font), so the benchmark writes its
picture on any machine the kit installs on, without matplotlib."""

from __future__ import annotations

import struct
import zlib

__all__ = ["bar_chart_png"]

# 5x7 glyphs, one string of 7 rows of 5 bits per character.
_FONT_SRC = {
    "0": "01110100011001110101110011000101110", "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111", "3": "11111000100010000010000011000101110",
    "4": "00010001100101010010111110001000010", "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110", "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110", "9": "01110100011000101111000010001001100",
    ".": "00000000000000000000000000110001100", "x": "00000000001000101010001000101010001",
    "_": "00000000000000000000000000000011111", "-": "00000000000000011111000000000000000",
    ":": "00000011000110000000011000110000000", "/": "00000000010001000100010001000000000",
    " ": "0" * 35, "*": "00000001001010101110101010010000000", "+": "00000001000010011111001000010000000",
}
_LETTERS = {
    "a": "00000000000111000001011111000101111", "b": "10000100001011011001100011000111110",
    "c": "00000000000111010000100001000101110", "d": "00001000010110110011100011000101111",
    "e": "00000000000111010001111111000001110", "f": "00110010010100011100010000100001000",
    "g": "00000011111000110001011110000101110", "h": "10000100001011011001100011000110001",
    "i": "00100000000110000100001000010001110", "j": "00010000000011000010000101001001100",
    "k": "10000100001001010100110001010010010", "l": "01100001000010000100001000010001110",
    "m": "00000000001101010101101011000110001", "n": "00000000001011011001100011000110001",
    "o": "00000000000111010001100011000101110", "p": "00000000001111010001111101000010000",
    "q": "00000000000110110011011110000100001", "r": "00000000001011011001100001000010000",
    "s": "00000000000111010000011100000111110", "t": "01000010001110001000010000100100110",
    "u": "00000000001000110001100011001101101", "v": "00000000001000110001100010101000100",
    "w": "00000000001000110001101011010101010", "y": "00000000001000110001011110000101110",
    "z": "00000000001111100010001000100011111",
}
_FONT = {**_FONT_SRC, **_LETTERS}


def _text(px, w, x0, y0, s, color):
    for ch in s.lower():
        g = _FONT.get(ch, _FONT["*"])
        for r in range(7):
            for c in range(5):
                if g[r * 5 + c] == "1":
                    x, y = x0 + c, y0 + r
                    if 0 <= x < w:
                        px[y][x] = color
        x0 += 6


def bar_chart_png(path, rows, *, title: str = "") -> None:
    """Write a horizontal bar chart of ``rows`` = [(label, value)] to ``path``.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "c.png")
        >>> bar_chart_png(p, [("kit add", 12.5), ("torch add", 60.0)], title="us per op")
        >>> open(p, "rb").read(4)
        b'\\x89PNG'
    """
    label_w = 6 * max([len(l) for l, _ in rows] + [1]) + 8
    bar_w, row_h, top = 360, 12, 16 if title else 4
    w, h = label_w + bar_w + 80, top + row_h * len(rows) + 4
    white, black, blue = (255, 255, 255), (0, 0, 0), (66, 110, 200)
    px = [[white] * w for _ in range(h)]
    if title:
        _text(px, w, 4, 4, title, black)
    vmax = max([v for _, v in rows] + [1e-12])
    for i, (label, v) in enumerate(rows):
        y = top + i * row_h
        _text(px, w, 4, y + 2, label, black)
        n = int(bar_w * v / vmax)
        for yy in range(y + 2, y + 10):
            for xx in range(label_w, label_w + max(n, 1)):
                px[yy][xx] = blue
        _text(px, w, label_w + n + 4, y + 2, f"{v:.3g}", black)
    raw = b"".join(b"\x00" + bytes([c for p in row for c in p]) for row in px)

    def chunk(kind, data):
        c = struct.pack(">I", len(data)) + kind + data
        return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)
