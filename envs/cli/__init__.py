"""The `vf-sandbox` command line: the app assembly and its sub-commands."""
