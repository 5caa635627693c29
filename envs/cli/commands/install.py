"""`python -m envs.cli.commands.install ARGS` = `vf-sandbox env install ARGS`."""

import sys

from envs.cli.app import app

if __name__ == "__main__":
    app(["env", "install", *sys.argv[1:]], prog_name="vf-sandbox")
