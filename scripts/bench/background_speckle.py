#!/usr/bin/env python3
"""How speckled the backgrounds of a dp-launch output folder are.

For each PNG in each OUTPUT_DIR, the two-pixel ring along the image's border (where the shapes
world never draws a shape's centre, so it is background almost everywhere) is compared with its
own median colour: the mean distance per channel, out of 255, and the share of ring pixels off by
more than 20. Prints one line per folder, so several models' outputs of the same prompts compare
side by side:

    scripts/bench/background_speckle.py OUT_A OUT_B

Only the standard library: 8-bit RGB PNGs as dp-launch writes them (no interlace).
"""
import glob
import os
import statistics
import struct
import sys
import zlib


def read_rgb_png(path):
    """(width, height, rows of bytes) of an 8-bit RGB, non-interlaced PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, width, height = 8, b"", 0, 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour != 2 or interlace != 0:
                raise ValueError(f"{path}: expected 8-bit RGB without interlace")
        elif kind == b"IDAT":
            idat += body
    raw, stride, bpp = zlib.decompress(idat), width * 3, 3
    rows, previous, at = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        for x in range(stride):
            left = line[x - bpp] if x >= bpp else 0
            up, up_left = previous[x], previous[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 255
        rows.append(line)
        previous = line
    return width, height, rows


def ring_speckle(path):
    """(mean distance, share off by more than 20) of the image's two-pixel border ring."""
    width, height, rows = read_rgb_png(path)
    ring = [tuple(rows[y][3 * x:3 * x + 3]) for y in range(height) for x in range(width)
            if min(x, y, width - 1 - x, height - 1 - y) < 2]
    median = [statistics.median(p[c] for p in ring) for c in range(3)]
    distance = [sum(abs(p[c] - median[c]) for c in range(3)) / 3 for p in ring]
    return sum(distance) / len(distance), sum(d > 20 for d in distance) / len(distance)


def main(folders):
    if not folders:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for folder in folders:
        images = sorted(glob.glob(os.path.join(folder, "*.png")))
        if not images:
            print(f"background_speckle: {folder}: no PNG images", file=sys.stderr)
            return 66
        scores = [ring_speckle(path) for path in images]
        mean = statistics.mean(s[0] for s in scores)
        off = 100 * statistics.mean(s[1] for s in scores)
        print(f"{folder}: {len(images)} images, border ring {mean:.2f}/255 from its median, "
              f"{off:.1f}% of its pixels off by more than 20")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
