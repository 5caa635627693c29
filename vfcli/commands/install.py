"""`python -m vfcli.commands.install ARGS` = `vf-sandbox env install ARGS`."""

import sys

from vfcli.app import app

if __name__ == "__main__":
    app(["env", "install", *sys.argv[1:]], prog_name="vf-sandbox")
