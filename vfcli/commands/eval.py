"""`python -m vfcli.commands.eval ARGS` = `vf-sandbox eval ARGS`."""

import sys

from vfcli.app import app

if __name__ == "__main__":
    app(["eval", *sys.argv[1:]], prog_name="vf-sandbox")
