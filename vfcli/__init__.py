"""The `vf-sandbox` command line: the app assembly (`app`) and its sub-commands
(`eval_cmd`, `runs_cmd`, `openenv_cmd`; `sandboxes` and `images` are mounted
from the `sandboxes` package), runnable per command (`commands`) and the Prime
CLI plugin (`plugins.prime`). It parses and prints; the work is below it."""
