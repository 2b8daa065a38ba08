"""The docs site as a reader gets it: built with `mkdocs build --strict`, served on localhost, opened in
headless Chromium (Debian's `chromium`, driven by Playwright without a browser download of its own).

It needs the docs extra and KaTeX (`make docs-setup`) and /usr/bin/chromium. Where one is missing the tests
skip and say which; with NORMLIB_REQUIRE_BROWSER=1 (set by .ci/run) they fail instead. Screenshots of every
page visited go to build/docs-screenshots/ (git-ignored), which CI keeps as artifacts.
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("NORMLIB_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "build" / "docs-screenshots"
NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
# the closed network here makes Chromium's own services log errors; a fresh profile keeps runs alike
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _missing() -> list[str]:
    out = [f"no {m} (pip install -e '.[docs]', or make docs-setup)"
           for m in ("mkdocs", "material", "mkdocstrings_handlers.python", "playwright")
           if importlib.util.find_spec(m.split(".")[0]) is None]
    if not (ROOT / "docs_tools" / "node_modules" / "katex").is_dir():
        out.append("no KaTeX in docs_tools/node_modules (make docs-setup)")
    if not os.access(CHROMIUM, os.X_OK):
        out.append(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    return out


def _skip_or_fail(reasons):
    msg = "docs site checks cannot run: " + "; ".join(reasons)
    if os.environ.get("NORMLIB_REQUIRE_BROWSER") == "1":
        pytest.fail(msg + " (NORMLIB_REQUIRE_BROWSER=1)")
    pytest.skip(msg)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    reasons = _missing()
    if reasons:
        _skip_or_fail(reasons)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield out, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        yield context
        context.close()


class _Visit:
    """One page opened with a record of what went wrong: console errors, page errors, failed or off-site
    requests (aborted: the site must need nothing from outside localhost)."""

    def __init__(self, context, url):
        self.problems: list[str] = []
        self.page = context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.route("**/*", self._local_only)
        response = self.page.goto(url, wait_until="load")
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        self.page.wait_for_load_state("networkidle")

    def _failed(self, request):
        # net::ERR_ABORTED: cancelled by the page leaving (a click or go_back while the search worker loads), not
        # a fault of the site; a missing file is a 404, which the console reports
        if request.failure != "net::ERR_ABORTED":
            self.problems.append(f"request failed: {request.url} {request.failure}")

    def _local_only(self, route):
        host = urlparse(route.request.url).hostname
        if host not in ("127.0.0.1", "localhost"):
            self.problems.append(f"off-site request: {route.request.url}")
            route.abort()
        else:
            route.continue_()

    def screenshot(self, name):
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


# Text a reader sees outside rendered math and code: no TeX may be left there.
_VISIBLE_TEXT = """() => {
  const body = document.querySelector("article") || document.body;
  const copy = body.cloneNode(true);
  copy.querySelectorAll(".katex, pre, code, script, style").forEach(e => e.remove());
  return copy.textContent;
}"""
_RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\s][^$]*\$|\\(?:frac|mu|sigma|sum|alpha|gamma|beta|epsilon)\b")


@pytest.mark.parametrize("path, min_math, min_images", [("math/", 50, 1), ("norms/cln/", 10, 1),
                                                        ("numerics/", 50, 1), ("backward/", 50, 0)])
def test_every_formula_renders_and_every_image_loads(site, browser, path, min_math, min_images):
    _, base = site
    v = _Visit(browser, urljoin(base, path))
    page = v.page
    marked = page.locator(".arithmatex").count()
    rendered = page.locator(".arithmatex .katex").count()
    assert marked >= min_math, f"{path}: {marked} formulas marked, expected at least {min_math}"
    assert rendered == marked, f"{path}: {marked - rendered} of {marked} formulas not rendered by KaTeX"
    assert page.locator(".katex-error").count() == 0
    # KaTeX's stylesheet applied: its fonts are the site's own
    family = page.evaluate("() => getComputedStyle(document.querySelector('.katex')).fontFamily")
    assert "KaTeX_Main" in family, family
    leftover = _RAW_TEX.findall(page.evaluate(_VISIBLE_TEXT))
    assert not leftover, f"{path}: raw TeX in the text: {leftover[:5]}"
    images = page.evaluate("""() => Array.from(document.querySelectorAll("article img"))
        .map(i => ({src: i.getAttribute("src"), ok: i.complete && i.naturalWidth > 0}))""")
    assert len(images) >= min_images, f"{path}: {len(images)} images, expected at least {min_images}"
    assert all(i["ok"] for i in images), f"{path}: images not loaded: {[i['src'] for i in images if not i['ok']]}"
    v.screenshot(path.strip("/").replace("/", "-"))
    assert not v.problems, f"{path}: " + "\n".join(v.problems)


def test_the_navigation_reaches_every_norm_page(site, browser):
    _, base = site
    v = _Visit(browser, base)
    page = v.page
    for name in NORMS:
        link = page.locator(".md-sidebar--primary a.md-nav__link", has_text=re.compile(rf"^\s*{name}\s*$"))
        assert link.count() == 1, f"the navigation has {link.count()} links named {name!r}"
        link.first.click()
        page.wait_for_load_state("load")
        assert page.url.rstrip("/").endswith(f"norms/{name}"), page.url
        heading = page.locator("article h1").inner_text()
        assert name in heading, f"{page.url}: heading {heading!r}"
        image = page.locator(f"article img[src$='norm-{name}.svg']")
        assert image.count() == 1 and image.evaluate("i => i.complete && i.naturalWidth > 0"), \
            f"{page.url}: its figure norm-{name}.svg did not load"
        page.go_back()
        page.wait_for_load_state("load")
    v.screenshot("index")
    assert not v.problems, "\n".join(v.problems)


def test_other_pages_with_figures_load_cleanly(site, browser):
    _, base = site
    for path in ("", "benchmarks/", "kernels/", "reference/", "models/", "streaming/"):
        v = _Visit(browser, urljoin(base, path))
        bad = v.page.evaluate("""() => Array.from(document.querySelectorAll("article img"))
            .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src"))""")
        assert not bad, f"{path}: images not loaded: {bad}"
        v.screenshot(path.strip("/").replace("/", "-") or "home")
        assert not v.problems, f"{path}: " + "\n".join(v.problems)
        v.page.close()


class _Refs(HTMLParser):
    """Every URL the page's markup makes the browser fetch: scripts, stylesheets and other links, images,
    sources, iframes."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video") and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("href") and a.get("rel") not in ("canonical", "alternate"):
            self.urls.append(a["href"])


def test_the_built_site_references_no_cdn(site):
    out, _ = site
    remote = re.compile(r"^(https?:)?//", re.I)
    found = []
    for page in out.rglob("*.html"):
        refs = _Refs()
        refs.feed(page.read_text(encoding="utf-8"))
        found += [f"{page.relative_to(out)}: {u}" for u in refs.urls if remote.match(u)]
    for css in out.rglob("*.css"):
        found += [f"{css.relative_to(out)}: {u}" for u in re.findall(r"url\(\s*['\"]?([^'\")]+)", css.read_text())
                  if remote.match(u)]
    assert not found, "remote assets:\n" + "\n".join(found[:20])
    assert (out / "assets" / "katex" / "katex.min.css").is_file()
    assert list((out / "assets" / "katex" / "fonts").glob("KaTeX_Main-Regular.woff2"))
