"""The one error hierarchy: a TraceqError is a problem the user can fix.

`str(error)` is one line saying what happened and what to do. The CLI alone turns these into
`traceq: <message>` on stderr and exit status `exit_code` (1, but 3 for a failed regression
gate); anything else is a bug and shows a traceback.
"""


class TraceqError(Exception):
    """A problem the user can fix; str(e) says what happened and what to do."""

    exit_code = 1


class OptionError(TraceqError, ValueError):
    """An option's value is none of its choices (the API's form of a CLI usage error); a ValueError
    too, for code that caught the ValueError an enum raised before."""


class TraceFormatError(TraceqError):
    """The input is not a trace traceq can read (or is damaged)."""


class StoreError(TraceqError):
    """The store cannot be opened, is busy, or was written by an incompatible traceq."""


class NotFoundError(TraceqError):
    """A trace, kernel or other named thing is not in the store."""


class MissingDataError(TraceqError):
    """The trace lacks what an analysis needs (say, no NVTX ranges)."""


class RegressionError(TraceqError):
    """`traceq compare --gate`: the second run is slower beyond the threshold and the noise."""

    exit_code = 3


class TraceqWarning(UserWarning):
    """A note about a result the user should read (an assumption made, data left out); the
    CLI prints each as `traceq: note: ...` on stderr."""
