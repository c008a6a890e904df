"""Reading notebooks without a 2-second detour at start-up.

nbformat validates notebooks with jsonschema, whose format checkers import
``rfc3987_syntax`` when it is installed (``jsonschema[format-nongpl]``, which Jupyter's
packages require, installs it); that module builds about 35 Earley parsers when it is
imported: 2.3 s of CPU on the course's 2-core CI machine (``python -X importtime -c 'import
nbformat'``), in every process that reads a notebook: each grading command, the grader's
workers' server, each ``python -m course_utils`` that runs notebooks
(python-jsonschema/jsonschema issue #1428). It checks one string format, ``iri``, which no
notebook schema uses. :func:`skip_iri_format_check` imports jsonschema's format checkers
with that module hidden, then un-hides it (an ``import rfc3987_syntax`` later works as
usual); only the ``iri`` format goes unchecked, in this process."""

from __future__ import annotations

import sys

_SLOW = "rfc3987_syntax"


def skip_iri_format_check() -> None:
    """Import jsonschema's format checkers without ``rfc3987_syntax``, unless either is
    imported already (or jsonschema is not installed)."""
    if "jsonschema._format" in sys.modules or _SLOW in sys.modules:
        return
    sys.modules[_SLOW] = None  # type: ignore[assignment]  # an import of it: ImportError
    try:
        import jsonschema._format  # noqa: F401  # lazy: with rfc3987_syntax hidden
    except ImportError:
        pass
    finally:
        del sys.modules[_SLOW]
