"""One root for everything the local LLM can refuse or fail at, so `fleet up` reports each
one the same way: the message, which says what and what to do, and exit code 2."""


class LocalLlmError(Exception):
    pass
