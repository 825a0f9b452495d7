"""Errors a user can fix. Front ends print the message as one line, never a traceback."""


class UserError(Exception):
    """Bad input or environment; the message is one line that says what to do."""
