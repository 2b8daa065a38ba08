"""A Griffe extension (mkdocs.yml, mkdocstrings' `extensions`): normlib's docstrings are written in PyTorch's
reST habits (``.. math::``, ``:math:`...```, ``:class:`...```, ``Examples::``), which mkdocstrings' Markdown
would print as they are. This turns them into the Markdown the site renders (arithmatex math, code spans)
before the docstrings are parsed, so the source keeps the form that ``help()`` and PyTorch users read."""
from __future__ import annotations

import re
import textwrap

import griffe

_MATH_BLOCK = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+\S.*\n|[ \t]*\n)+)", re.M)
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_XREF_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`~?([^`]+)`")
_EXAMPLES = re.compile(r"^([ \t]*)(Examples?)::[ \t]*$", re.M)


def to_markdown(text: str) -> str:
    def block(m):
        indent, body = m.group("indent"), textwrap.dedent(m.group("body")).strip("\n")
        return f"{indent}$$\n" + textwrap.indent(body, indent) + f"\n{indent}$$\n\n"

    text = _MATH_BLOCK.sub(block, text if text.endswith("\n") else text + "\n")
    text = _MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
    text = _XREF_ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _EXAMPLES.sub(r"\1\2:", text).rstrip("\n")


class RestToMarkdown(griffe.Extension):
    def on_package(self, *, pkg, **kwargs) -> None:
        seen = set()

        def walk(obj):
            if obj.is_alias or id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value)
            for member in obj.members.values():
                walk(member)

        walk(pkg)
        # Inspected (mkdocs.yml: force_inspection), a submodule without __all__ lists what it imports too, and
        # its attributes without their comments: its reference keeps the classes and functions it defines.
        for module in pkg.modules.values():
            if module.is_alias or "__all__" in module.members:
                continue
            for name, member in list(module.members.items()):
                if member.is_alias or member.is_attribute:
                    del module.members[name]
