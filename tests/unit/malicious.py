"""A pickle payload that runs code when unpickled: what a malicious checkpoint or data file does.
Loading code under test must refuse it without running it (``EXECUTED`` stays empty)."""

EXECUTED: list[bool] = []


def _side_effect():
    EXECUTED.append(True)
    return "pwned"


class Payload:
    def __reduce__(self):
        return (_side_effect, ())
