"""The one list of formats tests loop over: every registered format (built-ins and plug-ins),
so a new format is tested by the existing tests (STYLE.md point 18)."""

from lmdata.store.registry import available_formats

FORMATS = available_formats()
