"""Write the explorer: a static site (HTML, JS, CSS, data, thumbnails) for one run folder.

Everything is a plain file referenced by a relative path, so the site opens from a file
system (file://) or any static host (an S3 bucket), with no server, no CDN and no network.
Data files are JavaScript (`DEPICT.data(path, {...})`) rather than JSON because browsers
refuse fetch() on file:// pages but do load <script> files; the page loads the list of
the chosen view first and an item's detail chunk only when the item is opened.
"""
from __future__ import annotations

import io
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources

from pipeline.explore.data import Run, read_run, run_errors, view_details, view_id, view_list
from pipeline.store.fs import exists, join_url, read_json, write_bytes_atomic, write_json

log = logging.getLogger(__name__)

ASSETS = ("index.html", "app.js", "style.css")
THUMB_PX, FULL_PX, VIEW_PX = 128, 640, 256


@dataclass
class SiteResult:
    out: str
    views: int
    items: int
    images: int
    image_errors: int
    seconds: float


def write_site(run_url: str, out: str | None = None, *, workers: int = 8) -> SiteResult:
    """Build the site for `run_url` under `out` (default <run>/explorer); reruns reuse images."""
    start = time.perf_counter()
    run = read_run(run_url)
    out = out or join_url(run_url, "explorer")
    images = _item_images(run, out, workers)
    view_images = _view_images(run, out, workers, images)
    views = []
    for backbone in sorted(run.scores):
        for benchmark in run.items["benchmark"].unique(maintain_order=True).to_list():
            listing = view_list(run, benchmark, backbone, images)
            vid = listing["view"]
            _write_data(out, f"data/{vid}.js", listing)
            for n, chunk in enumerate(view_details(run, benchmark, backbone, images, view_images)):
                _write_data(out, f"data/{vid}/{n}.js", chunk)
            views.append({"view": vid, "benchmark": benchmark, "backbone": backbone, "items": len(listing["items"]["id"]), "metrics": listing["metrics"]})
    index = {"run": run.name, "run_url": run_url, "views": views, "errors": run_errors(run), "written_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    _write_data(out, "data/index.js", index)
    for name in ASSETS:
        write_bytes_atomic(join_url(out, name), resources.files("pipeline.explore").joinpath("static", name).read_bytes())
    bad = sum(1 for v in images.values() if v.get("error"))
    return SiteResult(out=out, views=len(views), items=run.items.height, images=len(images), image_errors=bad, seconds=time.perf_counter() - start)


def _write_data(out: str, path: str, payload) -> None:
    text = f"DEPICT.data({json.dumps(path)}, {json.dumps(payload, separators=(',', ':'), allow_nan=False)});\n"
    write_bytes_atomic(join_url(out, path), text.encode())


def _item_images(run: Run, out: str, workers: int) -> dict[str, dict]:
    """image_hash -> {thumb, full, width, height} (paths relative to the site) or {error}."""
    unique = run.items.select("image_hash", "image_uri").unique(subset="image_hash", keep="first").drop_nulls("image_hash")
    jobs = [(r["image_hash"], r["image_uri"]) for r in unique.iter_rows(named=True)]

    def one(job):
        h, uri = job
        thumb, full = f"img/t/{h}.jpg", f"img/f/{h}.jpg"
        size_url = join_url(out, f"img/f/{h}.json")
        try:
            if exists(size_url) and exists(join_url(out, thumb)):
                size = read_json(size_url)
            else:
                from operators.images import decode_image, read_image_bytes

                img = decode_image(read_image_bytes(uri), uri)
                size = {"width": img.width, "height": img.height}
                write_bytes_atomic(join_url(out, full), _jpeg(img, FULL_PX))
                write_bytes_atomic(join_url(out, thumb), _jpeg(img, THUMB_PX))
                write_json(size_url, size)
            return h, {"thumb": thumb, "full": full, **size}
        except Exception as exc:  # an image that vanished since the run: say so on the page
            return h, {"error": f"{type(exc).__name__}: {exc}"}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, jobs))


def _view_images(run: Run, out: str, workers: int, items: dict[str, dict]) -> dict[str, str]:
    """Masked-view image hash -> site path (views live in <store>/images/<hh>/<hash>.png;
    the full view is the item's own image)."""
    hashes = set()
    for views in run.views.values():
        for name in views.columns:
            if name.startswith("hash_"):
                hashes |= set(views[name].drop_nulls().to_list())
    known = {h: items[h]["full"] for h in hashes if items.get(h, {}).get("full")}
    hashes -= set(known)
    if not hashes or not run.store:
        return known

    def one(h):
        path = f"img/v/{h}.jpg"
        try:
            if not exists(join_url(out, path)):
                from operators.images import decode_image, read_image_bytes

                uri = join_url(run.store, "images", h[:2], f"{h}.png")
                write_bytes_atomic(join_url(out, path), _jpeg(decode_image(read_image_bytes(uri), uri), VIEW_PX))
            return h, path
        except Exception as exc:
            log.warning("view image %s: %s", h, exc)
            return h, None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return known | {h: p for h, p in pool.map(one, sorted(hashes)) if p}


def _jpeg(img, max_side: int) -> bytes:
    img = img.copy()
    img.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    img.convert("RGB").save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


__all__ = ["SiteResult", "view_id", "write_site"]
