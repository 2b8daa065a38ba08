"""The name table under the registry: normalized names and aliases -> registered layer classes.

It sits at the ground so that the functional API and the layers can resolve a name without importing the
registry, which sits above them (it makes layer classes). ``registry.register`` is the only writer.
"""
from __future__ import annotations

LAYERS: dict[str, type] = {}  # normalized name -> layer class
DESCRIPTIONS: dict[str, str] = {}  # normalized name -> one line
ALIASES: dict[str, str] = {}  # normalized alias -> normalized name


def normalize_name(name: str) -> str:
    """ "cLN", "c_ln" and "cln" are one name."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def resolve_name(name: str) -> str:
    """The registered name that ``name`` (a name or an alias, in any case) stands for."""
    key = normalize_name(name)
    key = ALIASES.get(key, key)
    if key not in LAYERS:
        known = ", ".join(sorted(LAYERS))
        alias = ", ".join(f"{a}->{k}" for a, k in sorted(ALIASES.items()))
        raise KeyError(f"unknown norm {name!r}; known norms: {known} (aliases: {alias})")
    return key


def lookup(name: str) -> type:
    """The layer class registered under ``name`` or an alias of it."""
    return LAYERS[resolve_name(name)]
