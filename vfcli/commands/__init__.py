"""One runnable module per command (`python -m vfcli.commands.eval ...`), the
form the Prime CLI plugin contract drives (vfcli.plugins.prime)."""
