"""The one exception type of the library: bad input a user can fix.

Library code raises UserError with the one line a command prints for it ("error: " + the message) and
never exits the process, so a notebook or another program can catch it. Each command's main turns it
into that line and its exit status (`code`: 1, or 2 for a malformed command line).
"""


class UserError(ValueError):
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.msg, self.code = msg, code
