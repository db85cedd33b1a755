"""Screenshot the built course site in a real browser and check that no code block overflows.

    make site-screenshots            # build the site, then this (not part of make test)
    python tools/site_screenshots.py [--site build/site] [--out build/screenshots]
                                     [--width 1280] [--pages GLOB ...] [--no-images]

The site is served from ``--site`` on a local port and every page (``**/index.html``) is
loaded at ``--width`` pixels in headless Chromium, driven by Playwright. For each page the tool

* saves a full-page screenshot, ``<out>/<page path>.png`` (``phases/02-paged-attention.png``);
* unfolds every ``<details>`` block (the deep dives' folded excerpts), so they are measured and
  shown too;
* measures every code block (``pre > code``) and every table: a code block *overflows* when
  its content is wider than its box (``scrollWidth > clientWidth``), which is what a reader
  sees as a horizontal scroll bar or, without one, cut-off code;
* counts the words broken in the middle inside table cells (a cell whose rendered width is
  narrower than its longest word);

writes ``<out>/report.json`` and prints a summary, and exits 1 if any code block overflows
(tables may scroll sideways; broken words are reported).

Why a real browser: overflow depends on fonts, the theme's CSS and the viewport, which no
HTML parser sees. The browser is the system's Chromium (``apt install chromium`` on Debian);
set ``CHROMIUM`` to another binary, or leave it unset to let Playwright use its own download
(``python -m playwright install chromium``) when no system Chromium is found. The Python side
is ``pip install -e '.[screenshots]'``, which ``make site-screenshots`` does on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import http.server
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SITE = ROOT / "build" / "site"
DEFAULT_OUT = ROOT / "build" / "screenshots"

# Runs in the page: what overflows, measured the way a reader sees it.
_MEASURE_JS = """
() => {
  // Folded blocks (the deep dives' excerpts) are measured, and shown, unfolded.
  document.querySelectorAll('.md-content details').forEach(d => { d.open = true; });
  const blocks = [...document.querySelectorAll('.md-content pre > code')];
  const overflowing = blocks
    .filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => ({
      over_px: c.scrollWidth - c.clientWidth,
      first_line: (c.innerText.split('\\n').find(l => l.length > 0) || '').slice(0, 80),
    }));
  const tables = [...document.querySelectorAll('.md-content table')];
  const wideTables = tables.filter(t => t.scrollWidth > t.clientWidth + 1).length;
  // A word broken mid-word: a cell's text node whose longest word is wider than the cell.
  const broken = [];
  const probe = document.createElement('span');
  probe.style.cssText = 'position:absolute;visibility:hidden;white-space:nowrap';
  document.body.appendChild(probe);
  for (const cell of document.querySelectorAll('.md-content td, .md-content th')) {
    const style = getComputedStyle(cell);
    const inner = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    for (const word of cell.innerText.split(/\\s+/)) {
      if (word.length < 6) continue;
      probe.style.font = style.font;
      probe.textContent = word;
      if (probe.getBoundingClientRect().width > inner + 1) { broken.push(word.slice(0, 60)); }
    }
  }
  probe.remove();
  const content = document.querySelector('.md-content');
  return {
    code_blocks: blocks.length,
    overflowing,
    tables: tables.length,
    wide_tables: wideTables,
    broken_words: broken,
    content_width: content ? content.clientWidth : 0,
    images: [...document.querySelectorAll('.md-content img')].map(i => ({
      src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
    })),
  };
}
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # the stdlib's signature; one line per request would drown the report


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on a free local port for the duration of the block; yield its URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def site_pages(site: Path, patterns: list[str]) -> list[str]:
    """Site-relative page URLs (``phases/02-paged-attention/``), filtered by ``patterns``."""
    pages = []
    for index in sorted(site.rglob("index.html")):
        rel = index.parent.relative_to(site).as_posix()
        url = "" if rel == "." else rel + "/"
        if url.startswith(("search/", "assets/")) or "404" in url:
            continue
        if patterns and not any(fnmatch.fnmatch(url, p) for p in patterns):
            continue
        pages.append(url)
    return pages


def find_chromium() -> str | None:
    """The system Chromium to drive (``$CHROMIUM`` first), or None for Playwright's own."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run(site: Path, out: Path, width: int, patterns: list[str], images: bool) -> dict[str, Any]:
    """Load every page, screenshot it, measure it; return the report."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise SystemExit(
            "the screenshots need playwright: pip install -e '.[screenshots]' "
            "(make site-screenshots does it)"
        ) from exc
    pages = site_pages(site, patterns)
    if not pages:
        raise SystemExit(f"no pages under {site}: run `make site` first")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"width": width, "pages": {}}
    executable = find_chromium()
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        for url in pages:
            page.goto(base + url, wait_until="load")
            page.wait_for_timeout(150)  # web fonts and the theme's layout settle
            measured = page.evaluate(_MEASURE_JS)
            if images:
                name = (url.rstrip("/") or "index").replace("/", "__") + ".png"
                page.screenshot(path=str(out / name), full_page=True)
                measured["screenshot"] = name
            report["pages"][url or "/"] = measured
        browser.close()
    return report


def summarize(report: dict[str, Any]) -> tuple[str, bool]:
    """A text summary, and whether the check passed (no code block overflows)."""
    pages = report["pages"]
    blocks = sum(p["code_blocks"] for p in pages.values())
    over = [(url, o) for url, p in pages.items() for o in p["overflowing"]]
    broken = [(url, w) for url, p in pages.items() for w in p["broken_words"]]
    wide = sum(p["wide_tables"] for p in pages.values())
    tables = sum(p["tables"] for p in pages.values())
    missing = [(url, i["src"]) for url, p in pages.items() for i in p["images"] if not i["loaded"]]
    lines = [
        f"{len(pages)} pages at {report['width']} px: {blocks} code blocks, {len(over)} "
        f"overflowing; {tables} tables, {wide} scrolling sideways; {len(broken)} words broken "
        f"inside table cells; {len(missing)} images not loaded",
    ]
    lines += [f"  overflow  {url}: +{o['over_px']} px, {o['first_line']!r}" for url, o in over]
    lines += [f"  broken    {url}: {w!r}" for url, w in broken[:20]]
    lines += [f"  no image  {url}: {src}" for url, src in missing]
    return "\n".join(lines), not over and not missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE, help="the built site")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="screenshots and report")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in px")
    parser.add_argument("--pages", nargs="*", default=[], help="glob(s) of page URLs to check")
    parser.add_argument("--no-images", action="store_true", help="measure only, no screenshots")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = run(args.site, args.out, args.width, args.pages, not args.no_images)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    text, ok = summarize(report)
    print(text)
    print(f"report: {args.out / 'report.json'} ({time.perf_counter() - start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
