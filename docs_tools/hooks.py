"""mkdocs hooks (mkdocs.yml `hooks:`): the figures made from data before a build, KaTeX's math rendered
into each page after it is written, KaTeX's stylesheet and fonts and benchmarks/RESULTS.md added to the
site."""
from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402
import katex  # noqa: E402

_renderer = katex.Renderer()


def on_config(config):
    katex.check_installed()  # fail at once, not after the pages
    figures.build()  # skipped when its inputs have not changed
    return config


def on_files(files, config):
    for rel in katex.asset_files():
        files.append(File.generated(config, f"{katex.ASSETS}/{rel.as_posix()}", abs_src_path=str(katex.DIST / rel)))
    # benchmarks/RESULTS.md, the record the charts are drawn from, as a page of the site
    files.append(File.generated(config, "results.md", abs_src_path=str(figures.ROOT / "benchmarks" / "RESULTS.md")))
    for path in figures.outputs():
        files.append(File.generated(config, f"{figures.SITE_DIR}/{path.name}", abs_src_path=str(path)))
    return files


def on_post_page(output, page, config):
    return _renderer.render_page(output, page.file.src_uri)


def on_shutdown():
    _renderer.close()
