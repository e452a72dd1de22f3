"""Subcommands of the idem-dialects CLI: each module has add_arguments(parser) and run(args) -> exit status.

Exit statuses, the same for every subcommand (docs: Command line):"""

EXIT_OK = 0  # done; every check passed (skips allowed)
EXIT_FAILED = 1  # a check failed, or the suite could not be collected
EXIT_UNAVAILABLE = 2  # a required engine could not be provisioned, or a database did not answer
EXIT_USAGE = 64  # the command line is wrong (sysexits' EX_USAGE; argparse's own 2 would read as "unavailable")
EXIT_CONFIG = 78  # a configuration error: URL, missing driver, missing tables or privileges (sysexits' EX_CONFIG)
