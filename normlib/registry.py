"""The registry: register, get, create and list norms by name. Names are normalized ("cLN", "c_ln" and
"cln" are one name); the table itself is ``names.py``, which the layers below can read."""
from __future__ import annotations

import functools

from torch import nn

from .modules import _CLASSES, _unregistered_class, layer_class
from .names import ALIASES as _ALIASES, DESCRIPTIONS as _DESCRIPTIONS, LAYERS as _LAYERS
from .names import normalize_name, resolve_name
from .spec import FAMILY, NormSpec


def register(name: str, target=None, *, aliases=(), description: str | None = None, overwrite=False):
    """Add a norm: ``target`` is a :class:`NormSpec` (its layer class is made) or an ``nn.Module`` class.

    Used without ``target`` it is a class decorator: ``@normlib.register("mynorm")``.
    """
    if not isinstance(name, str):
        hint = ' (as a decorator: @normlib.register("name"))' if isinstance(name, type) else ""
        raise TypeError(f"name must be a string{hint}, got {name!r}")
    if isinstance(aliases, str) or not isinstance(aliases, (list, tuple, set, frozenset)) or not all(
            isinstance(a, str) for a in aliases):
        raise TypeError(f"aliases must be a list or tuple of strings, got {aliases!r}")
    if target is None:
        return lambda cls: register(name, cls, aliases=aliases, description=description, overwrite=overwrite)
    if not (isinstance(target, NormSpec) or (isinstance(target, type) and issubclass(target, nn.Module))):
        raise TypeError(f"target must be a NormSpec or an nn.Module class, got {target!r}")
    key = normalize_name(name)
    alias_keys = [normalize_name(a) for a in aliases]
    if not key or not all(alias_keys):
        raise ValueError(f"a norm's name and aliases need a letter or digit, got {name!r} and aliases {aliases!r}")
    # an alias that is another norm's name would leave that norm listed under a name that no longer reaches it
    named = [a for a in alias_keys if a in _LAYERS and a != key]
    if named:  # even with overwrite=True, so said first
        raise ValueError(f"alias(es) {named} are registered norm names; register the norm under that name instead")
    taken = [k for k in (key, *alias_keys) if k in _LAYERS or k in _ALIASES]
    if taken and not overwrite:
        raise ValueError(f"norm name(s) {taken} already registered; pass overwrite=True to replace")
    if isinstance(target, NormSpec):
        cls, description = layer_class(target), description or target.description
    else:
        cls = target
    _LAYERS[key] = cls
    _ALIASES.pop(key, None)  # a name that overwrites an alias replaces it (aliases resolve first)
    _DESCRIPTIONS[key] = description or (cls.__doc__ or "").strip().split("\n")[0]
    for a in alias_keys:
        _ALIASES[a] = key
    return cls


def get(name):
    """The layer class for a name or alias, or for a :class:`NormSpec` (the class registered with it, else one
    made from it); a class or ``functools.partial`` is returned as given."""
    if isinstance(name, (type, functools.partial)):
        return name
    if isinstance(name, NormSpec):
        cls = _LAYERS.get(_ALIASES.get(normalize_name(name.name), normalize_name(name.name)))
        return cls if getattr(cls, "spec", None) == name else _unregistered_class(name)
    if not isinstance(name, str):
        raise TypeError(f"name must be a string (a norm's name or alias), a NormSpec or a layer class, got {name!r}")
    return _LAYERS[resolve_name(name)]


def create(name, num_channels: int, **kwargs) -> nn.Module:
    """An instance: ``create("cln", 64, eps=1e-5)``."""
    return get(name)(num_channels, **kwargs)


def available() -> dict[str, str]:
    """Registered names with a one-line description."""
    return dict(sorted(_DESCRIPTIONS.items()))


def aliases() -> dict[str, str]:
    return dict(_ALIASES)


# Other toolkits' names. Trap: several call the per-frame norm "cLN"; here `cln` is the cumulative one.
_FAMILY_ALIASES = {"cln": ("cumln", "cgln"), "frameln": ("chanln",), "instln": ("fgln",)}
for _spec in FAMILY:
    _LAYERS[_spec.name] = _CLASSES[_spec.name]
    _DESCRIPTIONS[_spec.name] = _spec.description
    for _a in _FAMILY_ALIASES.get(_spec.name, ()):
        _ALIASES[_a] = _spec.name
