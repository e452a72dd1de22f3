"""Subcommands of the idem-dialects CLI: each module has add_arguments(parser) and run(args) -> exit status."""
