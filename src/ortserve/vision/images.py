"""Image bytes -> RGB pixels, with the checks that make a bad image a 400 naming its field.

Every limit is checked before the pixels are decoded: the byte count first, then the header's
width x height (Pillow reads it without decoding), so a 20k x 20k PNG of a few kilobytes (a
decompression bomb) is refused from its header. Pillow's own bomb guard is kept as a second line:
``Image.MAX_IMAGE_PIXELS`` stays at Pillow's default (89 M pixels; a global, so it is not
changed per request) and both its ``DecompressionBombError`` and its warning (turned into an
error here) become a 400; so the effective limit is the lower of ``max_pixels`` and Pillow's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from ortserve.errors import InvalidRequest

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
               "image/gif": "GIF", "image/bmp": "BMP"}


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024   # per image, after base64 decoding
    max_pixels: int = 50_000_000        # width x height as the header states it
    max_images: int = 8                 # per request
    folder: Path | None = None          # file:// URLs are read under it (ORTSERVE_IMAGE_DIR); None: refused


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: its bytes (as sent), their sha256, and the field that carried it."""

    data: bytes
    param: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _bad(param: str, message: str, code: str = "invalid_image") -> InvalidRequest:
    return InvalidRequest(f"'{param}' {message}", param=param, code=code)


def from_base64(text: str, param: str, limits: ImageLimits) -> ImageInput:
    """A base64 payload (no data: prefix) as an image input, with the byte limit checked first."""
    if len(text) > (limits.max_bytes * 4) // 3 + 8:
        raise _too_many_bytes(param, limits, (len(text) * 3) // 4)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(param, "is not valid base64") from None
    if len(data) > limits.max_bytes:
        raise _too_many_bytes(param, limits, len(data))
    if not data:
        raise _bad(param, "is empty")
    return ImageInput(data, param)


def _too_many_bytes(param: str, limits: ImageLimits, size: int) -> InvalidRequest:
    return _bad(param, f"is {size} bytes, above this server's limit of {limits.max_bytes} bytes per image "
                "(ORTSERVE_IMAGE_MAX_BYTES)", code="image_too_large")


def from_url(url: str, param: str, limits: ImageLimits) -> ImageInput:
    """An image URL as OpenAI clients send it: ``data:image/...;base64,``, or ``file://`` under the
    operator's image folder; http(s) is refused because no request ever leaves the machine."""
    if not isinstance(url, str) or not url:
        raise _bad(param, "needs a URL (a data:image/...;base64, URL)")
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise _bad(param, "is an http(s) URL: ortserve never fetches anything (no request leaves the machine); "
                   "send the image inline as a data:image/png;base64,... URL", code="image_url_not_allowed")
    if head.startswith("file:"):
        return from_file_url(url, param, limits)
    if not head.startswith("data:"):
        raise _bad(param, "must be a data:image/...;base64,... URL (or a file:// URL under the server's image "
                   "folder); other schemes are not served", code="image_url_not_allowed")
    meta, comma, payload = url.partition(",")
    if not comma or not meta.lower().endswith(";base64"):
        raise _bad(param, "must be a base64 data URL: data:image/png;base64,...")
    media = meta[5:-7].lower()
    if media and not media.startswith("image/"):
        raise _bad(param, f"has media type {media!r}, not an image")
    return from_base64(payload, param, limits)


def from_file_url(url: str, param: str, limits: ImageLimits) -> ImageInput:
    """A ``file:///path`` URL, read only under the operator's image folder (``limits.folder``,
    ORTSERVE_IMAGE_DIR). The path must lie under the folder as written (``..`` refused, so nothing
    outside it is even looked at) and again once its symlinks are resolved; then it is read as a
    data URL's bytes are, under the same byte limit (checked on the file's size first)."""
    if limits.folder is None:
        raise _bad(param, "is a file:// URL, and this server reads no image files: the operator allows file:// "
                   "images under one folder with ORTSERVE_IMAGE_DIR (ortserve serve --image-dir DIR); or send the "
                   "image inline as a data:image/png;base64,... URL", code="image_url_not_allowed")
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise _bad(param, f"names the host {parts.netloc!r}: a file URL is file:///absolute/path on this machine",
                   code="image_url_not_allowed")
    path = unquote(parts.path)
    if parts.query or parts.fragment or "\0" in path or not path.startswith("/"):
        raise _bad(param, "must be file:///absolute/path (no query, fragment or relative path; escape '?' and "
                   "'#' in names as %3F and %23)", code="image_url_not_allowed")
    if ".." in PurePosixPath(path).parts:
        raise _bad(param, "has a '..' in its path: file:// images are named by their path under the image "
                   "folder, without '..'", code="image_url_not_allowed")
    root = Path(limits.folder).expanduser().absolute()   # as configured: a symlinked folder names files too
    real_root = root.resolve()
    outside = _bad(param, "is outside the server's image folder (ORTSERVE_IMAGE_DIR); only files under it are "
                   "served", code="image_url_not_allowed")
    named = Path(path)
    if not (named.is_relative_to(root) or named.is_relative_to(real_root)):
        raise outside
    try:
        real = named.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        raise _bad(param, "names no file in the server's image folder", code="image_not_found") from None
    except (OSError, RuntimeError) as exc:   # a symlink loop, a permission denied on the way
        raise _bad(param, f"could not be opened: {type(exc).__name__}") from None
    if not real.is_relative_to(real_root):
        raise outside   # a symlink under the folder that points out of it
    return ImageInput(_read_file(real, param, limits), param)


def _read_file(real: Path, param: str, limits: ImageLimits) -> bytes:
    """The bytes of a regular file (no FIFO or device: opened non-blocking, checked with fstat),
    at most the byte limit; the last component is not followed if it became a symlink since."""
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise _bad(param, f"could not be opened: {exc.strerror or type(exc).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _bad(param, "is not a regular file")
        if info.st_size > limits.max_bytes:
            raise _too_many_bytes(param, limits, info.st_size)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limits.max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > limits.max_bytes:   # grew since fstat
        raise _too_many_bytes(param, limits, len(data))
    if not data:
        raise _bad(param, "is empty")
    return data


@dataclass(frozen=True)
class Decoded:
    width: int
    height: int
    format: str
    rgb: object  # a PIL.Image.Image in mode RGB, fully loaded
    sha256: str = ""  # of the bytes as sent: the vision features' cache key (vision/features.py)


def decode(image: ImageInput, limits: ImageLimits) -> Decoded:
    """The image's pixels in RGB; not an image, truncated, too many pixels -> 400 on its field."""
    from PIL import Image, UnidentifiedImageError

    param = image.param
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(image.data))
            width, height = img.size
            if img.format not in FORMATS:
                raise _bad(param, f"is a {img.format} image; send one of {', '.join(FORMATS)}",
                           code="invalid_image_format")
            if width * height > limits.max_pixels:
                raise _too_many_pixels(param, width, height, limits)
            img.load()
            rgb = img.convert("RGB")
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # Pillow's guard, a second line
        raise _bad(param, f"is refused as a decompression bomb: {exc}", code="image_too_large") from None
    except UnidentifiedImageError:
        raise _bad(param, f"is not an image (send one of {', '.join(FORMATS)})", code="invalid_image_format") from None
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise _bad(param, f"could not be decoded: {exc} (truncated or corrupt)") from None
    return Decoded(width, height, img.format or "", rgb, image.sha256)


def _too_many_pixels(param: str, width: int, height: int, limits: ImageLimits) -> InvalidRequest:
    return _bad(param, f"is {width}x{height} = {width * height} pixels, above this server's limit of "
                f"{limits.max_pixels} pixels per image (ORTSERVE_IMAGE_MAX_PIXELS)", code="image_too_large")


def check_count(images: list[ImageInput], limits: ImageLimits) -> None:
    if len(images) > limits.max_images:
        param = images[limits.max_images].param
        raise InvalidRequest(f"the request has {len(images)} images, above this server's limit of "
                             f"{limits.max_images} per request (ORTSERVE_IMAGE_MAX_IMAGES); '{param}' is the "
                             f"first one past it", param=param, code="too_many_images")
