"""The one exception type users see: a message that names the file or flag and the fix.

The CLI prints ``LmdataError`` as a single ``error: ...`` line and exits 1; any other
exception is a bug and keeps its traceback.
"""


class LmdataError(Exception):
    """Bad input or a broken store: the message says which file/argument and what to do."""


class SettingError(LmdataError):
    """A setting the user gave (an environment variable) is invalid: the message names it and its range.
    Never a property of a store: ``lmdata verify`` raises it rather than listing it as a problem found."""
