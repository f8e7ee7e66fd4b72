"""Input images as diffusers loads them (diffusers.utils.load_image: PIL.Image.open, then
PIL.ImageOps.exif_transpose, then convert("RGB")), Pillow's resizes and its convert("L"), for the
image-input library images/ (images/input_image.h). Files:

- tests/data/golden/images/: small input files, one per kind a user may hand in (CASES below: PNG of
  every colour type and depth PIL reads, interlaced, with EXIF and XMP orientations; JPEG baseline
  4:2:0, 4:2:2 and 4:4:4, progressive, grayscale, CMYK, the EXIF orientations 2 to 8; WebP lossy
  and lossless, with alpha, with an EXIF orientation), and the files PIL refuses or that we refuse
  (REFUSED: image bombs declaring more pixels than images/ accepts, an animated WebP).
- tests/data/golden/images.safetensors: what PIL makes of them, U8 [height, width, 3]. Its metadata
  ("cases") has, per input file, the tensor of its pixels ("decoded": equal files share one
  tensor); per resize, the source (an input file's pixels or pattern(width, height)), the filter
  and the size; per convert("L"), its source; and the refused files with why.

pattern(width, height) is an RGB image of integer formulas (pattern() below) that the C++ test
computes alike, so that the large resize needs no large file. Checked facts of Pillow 13 that
images/ follows are in images/input_image.h (Note [input images]).
"""
import io
import json
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps
from safetensors.numpy import save_file

from make_golden import OUT

PARTS = ["images"]

W, H = 37, 23  # odd sizes: no row is a multiple of a SIMD width, no side a multiple of 8
SMALL_W, SMALL_H = 9, 5  # the orientation cases


def pattern(width, height):
    """R, G, B of pixel (x, y): sharp and smooth parts, every byte value; integers only."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    r = (3 * x + 7 * y + ((x * y) >> 2)) % 256
    g = (5 * x + 2 * y * y) % 256
    b = np.where((x // 4 + y // 3) % 2 == 0, 230 - (x * 255) // max(width - 1, 1) // 2, 20 + (y * 255) // max(height - 1, 1) // 2)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def photo(width, height, seed):
    """A smooth image with an edge and a little noise: what JPEG and WebP are made for."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([128 + 100 * np.sin(x / 6.0 + c) * np.cos(y / 5.0 - c) for c in range(3)], axis=-1)
    image[:, width // 2:, 0] = 255 - image[:, width // 2:, 0]
    return np.clip(image + rng.normal(0, 6, image.shape), 0, 255).round().astype(np.uint8)


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_rows(samples, bit_depth):
    """Row bytes of an array [h, w, channels] of samples (uint8 or uint16 values), filter 0."""
    h = samples.shape[0]
    if bit_depth == 16:
        rows = samples.astype(">u2").reshape(h, -1)
        return [row.tobytes() for row in rows]
    if bit_depth == 8:
        return [row.tobytes() for row in samples.astype(np.uint8).reshape(h, -1)]
    per_byte = 8 // bit_depth
    out = []
    for row in samples.reshape(h, -1):
        padded = np.concatenate([row, np.zeros((-len(row)) % per_byte, dtype=row.dtype)]).reshape(-1, per_byte)
        shifts = np.arange(per_byte - 1, -1, -1) * bit_depth
        out.append(np.sum(padded.astype(np.int64) << shifts, axis=1).astype(np.uint8).tobytes())
    return out


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png_file(samples, bit_depth, color_type, interlace=False, before=(), after=(), width=None, height=None,
             idat=None):
    """A PNG written by hand (PIL writes no 16-bit RGB, no interlacing): IHDR, `before` chunks,
    one IDAT, `after` chunks, IEND. `width`/`height` override the header's size (image bombs)."""
    h, w = samples.shape[:2]
    raw = b""
    if interlace:
        for xs, ys, xstep, ystep in ADAM7:
            sub = samples[ys::ystep, xs::xstep]
            if sub.shape[0] and sub.shape[1]:
                raw += b"".join(b"\0" + row for row in _png_rows(sub, bit_depth))
    else:
        raw = b"".join(b"\0" + row for row in _png_rows(samples, bit_depth))
    ihdr = struct.pack(">IIBBBBB", width or w, height or h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    body = _chunk(b"IHDR", ihdr) + b"".join(_chunk(k, d) for k, d in before)
    body += _chunk(b"IDAT", idat if idat is not None else zlib.compress(raw, 9))
    body += b"".join(_chunk(k, d) for k, d in after) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def tiff_orientation(value, big_endian=False):
    """A TIFF structure (EXIF without the "Exif\\0\\0" prefix) of IFD0 with the Orientation tag alone."""
    e = ">" if big_endian else "<"
    return (b"MM\0*" if big_endian else b"II*\0") + struct.pack(e + "IHHHIHHI", 8, 1, 274, 3, 1, value, 0, 0)


def pil_bytes(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def exif(value):
    e = Image.Exif()
    e[274] = value
    return e


def xmp(text):
    return ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" {text}</rdf:Description></rdf:RDF></x:xmpmeta>'
            '<?xpacket end="w"?>')


def input_files():
    """File name -> bytes of every input PIL accepts."""
    base = pattern(W, H)
    smooth = photo(W, H, 1)
    alpha = ((np.arange(W)[None, :] * 7 + np.arange(H)[:, None] * 11) % 256).astype(np.uint8)
    grey = base[:, :, 0]
    grey16 = (base[:, :, 0].astype(np.uint16) * 3 + base[:, :, 1].astype(np.uint16) * 250)
    grey16[0, :] = np.arange(W)  # values under 256, which convert("RGB") keeps
    rgb16 = base.astype(np.uint16) * 256 + base[:, :, ::-1]  # the low bytes: PIL drops them, rounding would not
    palette = Image.fromarray(smooth).quantize(colors=16, method=Image.Quantize.MEDIANCUT)
    files = {
        "png_rgb8.png": pil_bytes(Image.fromarray(base), "PNG"),
        "png_rgba8.png": pil_bytes(Image.fromarray(np.dstack([base, alpha])), "PNG"),
        "png_palette4_trns.png": pil_bytes(palette, "PNG", bits=4, transparency=bytes(range(0, 256, 16))),
        "png_grey8.png": pil_bytes(Image.fromarray(grey), "PNG"),
        "png_grey_alpha8.png": pil_bytes(Image.fromarray(np.dstack([grey, alpha]), "LA"), "PNG"),
        "png_grey2.png": png_file((grey >> 6)[:, :, None], 2, 0),
        "png_grey1.png": png_file((grey >> 7)[:, :, None], 1, 0),
        "png_rgb16.png": png_file(rgb16, 16, 2),
        "png_rgba16.png": png_file(np.dstack([rgb16, alpha.astype(np.uint16) * 300]), 16, 6),
        "png_grey16.png": png_file(grey16[:, :, None], 16, 0),
        "png_grey_alpha16.png": png_file(np.dstack([grey16, grey16[::-1]]), 16, 4),
        "png_rgb8_interlaced.png": png_file(base, 8, 2, interlace=True),
        "png_rgb8_trns.png": png_file(base, 8, 2, before=[(b"tRNS", struct.pack(">HHH", *base[0, 0]))]),
        "png_exif_mm_orientation5.png": png_file(base, 8, 2, after=[(b"eXIf", tiff_orientation(5, True))]),
        "png_xmp_orientation8.png": pil_bytes(
            Image.fromarray(base), "PNG",
            pnginfo=_itxt("XML:com.adobe.xmp", xmp("><tiff:Orientation>8</tiff:Orientation>"))),
        "jpeg_420.jpg": pil_bytes(Image.fromarray(smooth), "JPEG", quality=90, subsampling=2),
        "jpeg_422.jpg": pil_bytes(Image.fromarray(smooth), "JPEG", quality=90, subsampling=1),
        "jpeg_444.jpg": pil_bytes(Image.fromarray(smooth), "JPEG", quality=90, subsampling=0),
        "jpeg_progressive.jpg": pil_bytes(Image.fromarray(smooth), "JPEG", quality=85, progressive=True),
        "jpeg_grey.jpg": pil_bytes(Image.fromarray(smooth[:, :, 1]), "JPEG", quality=90),
        "jpeg_cmyk.jpg": pil_bytes(Image.frombytes("CMYK", (W, H), np.dstack([smooth, alpha]).tobytes()), "JPEG",
                                   quality=90),
        "jpeg_xmp_orientation7.jpg": pil_bytes(Image.fromarray(smooth), "JPEG", quality=90,
                                               xmp=xmp('tiff:Orientation="7">').encode()),
        "webp_lossy.webp": pil_bytes(Image.fromarray(smooth), "WEBP", quality=80),
        "webp_lossless.webp": pil_bytes(Image.fromarray(base), "WEBP", lossless=True),
        "webp_lossy_alpha.webp": pil_bytes(Image.fromarray(np.dstack([smooth, alpha])), "WEBP", quality=80),
        "webp_lossless_alpha.webp": pil_bytes(Image.fromarray(np.dstack([base, alpha])), "WEBP", lossless=True,
                                              exact=True),
        "webp_exif_orientation3.webp": pil_bytes(Image.fromarray(smooth), "WEBP", quality=80, exif=exif(3)),
    }
    small = photo(SMALL_W, SMALL_H, 2)
    for value in range(1, 9):
        files[f"jpeg_exif_orientation{value}.jpg"] = pil_bytes(Image.fromarray(small), "JPEG", quality=95,
                                                              exif=exif(value))
    return files


def _itxt(key, text):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_itxt(key, text)
    return info


def refused_files():
    """File name -> (bytes, why) of the inputs images/ refuses before decoding."""
    jpeg = bytearray(pil_bytes(Image.fromarray(photo(16, 8, 3)), "JPEG", quality=90))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5:sof + 9] = struct.pack(">HH", 60000, 60000)  # height, width
    lossless = bytearray(pil_bytes(Image.fromarray(photo(16, 8, 3)), "WEBP", lossless=True))
    assert lossless[12:16] == b"VP8L" and lossless[20] == 0x2F
    bits = struct.unpack("<I", bytes(lossless[21:25]))[0] & ~((1 << 28) - 1)
    lossless[21:25] = struct.pack("<I", bits | (16383 << 14) | 16383)  # 16384 x 16384
    frames = [Image.fromarray(photo(16, 8, s)) for s in (4, 5)]
    return {
        "bomb_png.png": (png_file(np.zeros((1, 1, 3), np.uint8), 8, 2, width=100000, height=100000), "pixels"),
        "bomb_jpeg.jpg": (bytes(jpeg), "pixels"),
        "bomb_webp.webp": (bytes(lossless), "pixels"),
        "webp_animated.webp": (pil_bytes(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50),
                               "animated"),
    }


def load_image(path):
    """diffusers.utils.load_image, without the diffusers import. (Converting the palette image with
    tRNS, PIL warns that such images should be converted to RGBA: it drops the alpha all the same.)"""
    return np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))


RESIZES = [  # (source, filter, width, height)
    ("png_rgb8.png", "lanczos", 16, 16),
    ("png_rgb8.png", "lanczos", 48, 30),
    ("png_rgb8.png", "lanczos", 24, 48),
    ("png_rgb8.png", "lanczos", 1, 1),
    ("png_rgb8.png", "lanczos", 37, 5),  # one axis only
    ("jpeg_420.jpg", "lanczos", 20, 30),
    ("pattern:400x300", "lanczos", 9, 7),  # a factor of 44: supports of 133 pixels
    ("pattern:400x300", "lanczos", 41, 29),
    ("png_rgb8.png", "bicubic", 16, 16),
    ("png_rgb8.png", "bicubic", 48, 30),
    ("png_rgb8.png", "bilinear", 16, 16),
    ("png_rgb8.png", "bilinear", 48, 30),
    ("png_rgb8.png", "nearest", 16, 16),
    ("png_rgb8.png", "nearest", 48, 30),
    ("png_rgb8.png", "nearest", 24, 48),
    ("pattern:400x300", "nearest", 9, 7),
]
# Image.resize with a box (VaeImageProcessor's "fill" resizes a zero-height or zero-width edge).
BOX_RESIZES = [  # (source, filter, width, height, box)
    ("pattern:64x48", "lanczos", 64, 5, (0, 0, 64, 0)),
    ("pattern:64x48", "lanczos", 64, 5, (0, 48, 64, 48)),
    ("pattern:64x48", "lanczos", 7, 48, (64, 0, 64, 48)),
    ("pattern:37x23", "bicubic", 20, 10, (3.5, 2.25, 30.0, 20.75)),
    ("pattern:37x23", "bilinear", 11, 13, (1.0, 0.0, 36.5, 23.0)),
    ("pattern:37x23", "lanczos", 10, 5, (2, 3, 12, 8)),  # whole pixels at the asked size: a crop
]
# VaeImageProcessor.resize's modes (diffusers 0.42.1, lanczos).
MODES = [("pattern:64x48", "fill", 32, 32), ("pattern:64x48", "crop", 32, 32), ("pattern:37x23", "fill", 24, 40),
         ("pattern:37x23", "crop", 24, 40), ("pattern:37x23", "fill", 40, 16), ("pattern:37x23", "crop", 40, 16),
         ("pattern:64x48", "fill", 48, 36), ("pattern:400x300", "fill", 33, 17), ("pattern:400x300", "crop", 17, 33)]
# get_crop_region(mask, width, height, pad)
CROP_REGIONS = [("a", 32, 32, 0), ("a", 32, 32, 8), ("a", 64, 16, 4), ("a", 16, 64, 4), ("b", 32, 32, 2),
                ("b", 8, 40, 0), ("c", 32, 48, 0), ("a", 48, 48, 100), ("d", 40, 24, 3)]
# apply_overlay(mask, original, generated of the processing size, get_crop_region(mask, w, h, pad))
OVERLAYS = [("pattern:64x48", "a", 32, 32, 8, 1), ("pattern:37x23", "b", 40, 24, 2, 2),
            ("pattern:64x48", "d", 40, 24, 3, 3), ("pattern:64x48", "c", 32, 48, 0, 4)]


def masks():
    """Grey masks: a block with a grey band and a lone faint pixel; one pixel; all white; a ramp."""
    a = np.zeros((48, 64), np.uint8)
    a[10:21, 40:56] = 255
    a[12:14, 30:40] = 128
    a[30, 5] = 1
    b = np.zeros((23, 37), np.uint8)
    b[20, 3] = 1
    c = np.full((48, 64), 255, np.uint8)
    d = np.zeros((48, 64), np.uint8)
    d[5:41, :] = (np.arange(64) * 255 // 63).astype(np.uint8)
    return {"a": a, "b": b, "c": c, "d": d}


FILTERS = {"lanczos": Image.LANCZOS, "bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR,
           "nearest": Image.NEAREST}
GREYS = ["png_rgb8.png", "jpeg_420.jpg", "pattern:64x48"]


def _processor(meta, keep, source):
    """Box resizes, VaeImageProcessor's resize modes, get_crop_region and apply_overlay."""
    from diffusers.image_processor import VaeImageProcessor

    processor = VaeImageProcessor()
    meta["box_resizes"], meta["modes"], meta["crop_regions"], meta["overlays"] = [], [], [], []
    for spec, filt, w, h, box in BOX_RESIZES:
        out = np.asarray(Image.fromarray(source(spec)).resize((w, h), FILTERS[filt], box=box))
        meta["box_resizes"].append({"source": spec, "filter": filt, "width": w, "height": h, "box": list(box),
                                    "tensor": keep("boxed", out)})
    for spec, mode, w, h in MODES:
        out = np.asarray(processor.resize(Image.fromarray(source(spec)), h, w, resize_mode=mode))
        meta["modes"].append({"source": spec, "mode": mode, "width": w, "height": h, "tensor": keep("mode", out)})
    grey = {k: keep("mask", v) for k, v in masks().items()}
    meta["masks"] = grey
    for name, w, h, pad in CROP_REGIONS:
        box = VaeImageProcessor.get_crop_region(Image.fromarray(masks()[name]), w, h, pad=pad)
        meta["crop_regions"].append({"mask": name, "width": w, "height": h, "pad": pad, "box": [int(v) for v in box]})
    for spec, name, w, h, pad, seed in OVERLAYS:
        mask = Image.fromarray(masks()[name])
        box = VaeImageProcessor.get_crop_region(mask, w, h, pad=pad)
        generated = photo(w, h, seed)
        out = np.asarray(processor.apply_overlay(mask, Image.fromarray(source(spec)), Image.fromarray(generated), box))
        meta["overlays"].append({"source": spec, "mask": name, "box": [int(v) for v in box],
                                 "generated": keep("generated", generated), "tensor": keep("overlay", out)})


def images():
    folder = os.path.join(OUT, "images")
    os.makedirs(folder, exist_ok=True)
    tensors, meta = {}, {"inputs": {}, "refused": {}, "resizes": [], "greys": []}

    def keep(prefix, array):
        for name, t in tensors.items():
            if t.shape == array.shape and np.array_equal(t, array):
                return name
        name = f"{prefix}.{len(tensors)}"
        tensors[name] = np.ascontiguousarray(array)
        return name

    decoded = {}
    for name, data in sorted(input_files().items()):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        decoded[name] = load_image(os.path.join(folder, name))
        meta["inputs"][name] = keep("pixels", decoded[name])
    for name, (data, why) in sorted(refused_files().items()):
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        meta["refused"][name] = why

    def source(spec):
        if spec.startswith("pattern:"):
            w, h = (int(v) for v in spec.split(":")[1].split("x"))
            return pattern(w, h)
        return decoded[spec]

    for spec, filt, w, h in RESIZES:
        out = np.asarray(Image.fromarray(source(spec)).resize((w, h), FILTERS[filt]))
        meta["resizes"].append({"source": spec, "filter": filt, "width": w, "height": h,
                                "tensor": keep("resized", out)})
    for spec in GREYS:
        out = np.asarray(Image.fromarray(source(spec)).convert("L"))
        meta["greys"].append({"source": spec, "tensor": keep("grey", out)})
    _processor(meta, keep, source)
    path = os.path.join(OUT, "images.safetensors")
    save_file(tensors, path, metadata={"cases": json.dumps(meta, sort_keys=True)})
    total = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes; {folder}: {total} bytes")
