"""The project's own error type: one clear sentence naming the bad key, file or value."""


class ConfigError(ValueError):
    """A configuration value, input file or checkpoint that cannot be used.

    The message is one sentence that names the key (or file) and says what is allowed.
    Entry points print it without a traceback and exit with status 2.
    """
