"""Exit codes of the ``autofusion`` command (documented in ``app.cli``)."""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_CONFIG = 2
EXIT_MODEL = 3
EXIT_PATTERN = 4
EXIT_INTERNAL = 5  # a bug of ours: one line, the traceback only with AUTOFUSION_DEBUG=1
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
