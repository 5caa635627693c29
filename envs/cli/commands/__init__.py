"""One runnable module per command (`python -m envs.cli.commands.eval ...`), the
form the Prime CLI plugin contract drives (envs.cli.plugins.prime)."""
