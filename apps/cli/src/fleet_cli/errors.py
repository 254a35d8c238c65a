"""The CLI's one error: what went wrong, worded for the person at the terminal."""


class ClientError(Exception):
    """What went wrong talking to the gateway, worded for the person at the terminal."""
