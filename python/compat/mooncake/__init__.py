"""tide's drop-in for Mooncake's Python package (distribution tide-mooncake-compat).

``mooncake.engine`` is tide's Mooncake-compatible module.  This package never
shadows a real Mooncake silently: importing it raises ImportError when

- another installed distribution is Mooncake: its name starts with "mooncake"
  (mooncake-transfer-engine and its variants), or it installs files under
  ``mooncake/``; or
- another ``mooncake`` package is on ``sys.path`` (a source tree on
  PYTHONPATH, another site directory);

unless ``TIDE_MOONCAKE_COMPAT=force`` is set, which loads tide's anyway (and
logs a warning on the logger "tide").
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

_OURS = "tide-mooncake-compat"
_HERE = Path(__file__).resolve().parent


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _other_distributions():
    """'name version' of each installed distribution, other than this one, that is Mooncake."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        name = _normalized(dist.metadata.get("Name") or "")
        if not name or name == _OURS:
            continue
        files = dist.files or []
        if name.startswith("mooncake") or any(str(f).replace("\\", "/").startswith("mooncake/") for f in files):
            found.append(f"{dist.metadata.get('Name')} {dist.version}")
    return sorted(set(found))


def _is_this_drop_in(candidate: Path) -> bool:
    """A copy of this package (the source tree's python/compat/mooncake, the installed one, a
    build/lib copy) beside the one imported: the same drop-in, not a Mooncake to refuse."""
    try:
        text = (candidate / "__init__.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return f'_OURS = "{_OURS}"' in text and not any(candidate.glob("engine*.so"))


def _other_packages():
    """Other directories named mooncake (a package) on sys.path."""
    found = []
    for entry in sys.path:
        candidate = Path(entry or ".") / "mooncake"
        try:
            if not candidate.is_dir() or candidate.resolve() == _HERE or _is_this_drop_in(candidate):
                continue
            if (candidate / "__init__.py").is_file() or any(candidate.glob("engine*.so")):
                found.append(str(candidate))
        except OSError:
            continue
    return found


def _check() -> None:
    conflicts = [f"distribution {d}" for d in _other_distributions()] + \
        [f"package {p}" for p in _other_packages()]
    if not conflicts:
        return
    if os.environ.get("TIDE_MOONCAKE_COMPAT", "").strip().lower() == "force":
        logging.getLogger("tide").warning("tide-mooncake-compat: TIDE_MOONCAKE_COMPAT=force: tide's mooncake.engine "
                                          "is used although Mooncake is installed (%s)", "; ".join(conflicts))
        return
    raise ImportError(
        "tide-mooncake-compat refuses to stand in for Mooncake, which is installed here ("
        + "; ".join(conflicts) + "): importing `mooncake` would be one or the other by chance of install order. "
        "Uninstall one of them (pip uninstall tide-mooncake-compat, or Mooncake's distribution), or set "
        "TIDE_MOONCAKE_COMPAT=force to use tide's TransferEngine anyway.", name="mooncake")


_check()
