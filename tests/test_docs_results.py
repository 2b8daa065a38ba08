"""The docs' charts read benchmarks/RESULTS.md (docs_tools/results.py): every table they draw must be found
and parse, so an edit of that page that moves a table or a column fails here, in `make test`, and not only
in the docs build."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "docs_results", Path(__file__).resolve().parent.parent / "docs_tools" / "results.py")
results = sys.modules["docs_results"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up there
_spec.loader.exec_module(results)


def test_every_table_the_charts_draw_is_found_and_parses():
    tabs = results.tables()
    tasnet = results.find(tabs, section="Models on the GPU", caption="Causal Conv-TasNet", columns=["norm layers"])
    assert any("normlib" in r[0] for r in tasnet.rows)
    assert all(results.pair(c) is None or len(results.pair(c)) == 2 for r in tasnet.rows for c in r[1:])
    results.find(tabs, section="Models on the GPU", caption="Channels-last TCN", columns=["norm layers"])
    large = results.find(tabs, section="Kernels on the GPU", caption="Large shapes", columns=["norm", "B, C, T"])
    assert {r[0] for r in large.rows} >= {"cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln"}
    assert all(results.pair(c) for r in large.rows for c in r[2:])
    comp = results.find(tabs, section="Kernels on the GPU", caption="Against torch.compile", columns=["norm"])
    assert all(results.pair(c) for r in comp.rows for c in r[1:5])
    cpu = results.find(tabs, section="The CPU", columns=["norm", "against"])
    assert all(len(results.numbers(c)) == 2 for r in cpu.rows for c in r[2:])
    assert results.commit_of(tasnet.section_text) and results.commit_of(cpu.section_text)


def test_cells_read_as_the_page_writes_them():
    assert results.pair("**38.3 / 10.3**") == (38.3, 10.3)
    assert results.pair("0.72 / 0.50 †") == (0.72, 0.5)
    assert results.pair("") is None
    assert results.numbers("42 ms (1.25 ×)") == [42.0, 1.25]
    with pytest.raises(results.ResultsFormatError):
        results.pair("2.85 (10.2 µs) / 3")


def test_a_missing_table_or_column_names_itself():
    text = "## The CPU\n\n**Models** (small)\n\n| model | cln |\n|---|---|\n| tcn | 1.0 |\n"
    tabs = results.tables(text)
    assert tabs[0].caption == "Models" and tabs[0].records() == [{"model": "tcn", "cln": "1.0"}]
    with pytest.raises(results.ResultsFormatError, match="no column 'formula'"):
        results.find(tabs, section="The CPU", columns=["formula"])
    with pytest.raises(results.ResultsFormatError, match="Large shapes"):
        results.find(tabs, section="Kernels", caption="Large shapes")
