"""LoomError and Loom's result codes."""

SUCCESS = 0
UNHANDLED_CUDA_ERROR = 1
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8

_NAMES = {
    SUCCESS: "loomSuccess",
    UNHANDLED_CUDA_ERROR: "loomUnhandledCudaError",
    SYSTEM_ERROR: "loomSystemError",
    INTERNAL_ERROR: "loomInternalError",
    INVALID_ARGUMENT: "loomInvalidArgument",
    INVALID_USAGE: "loomInvalidUsage",
    REMOTE_ERROR: "loomRemoteError",
    IN_PROGRESS: "loomInProgress",
    TIMEOUT: "loomTimeout",
}


class LoomError(RuntimeError):
    """A failed Loom call: `code` is the loomResult_t, `message` says what went
    wrong and names the argument or peer at fault (loomGetLastError's text for
    failures inside the library)."""

    def __init__(self, code, message):
        self.code = code
        self.message = message
        super().__init__("%s: %s" % (_NAMES.get(code, "result %d" % code), message))

    def __reduce__(self):  # pickled and copied by its code and message (process pools)
        return (type(self), (self.code, self.message))


def check(result):
    """Raises LoomError for a result other than loomSuccess, with the C library's last error."""
    if result == SUCCESS:
        return
    from ._lib import load

    text = load().loomGetLastError(None)
    raise LoomError(result, text.decode("utf-8", "replace") if text else "(no message)")
