#!/bin/bash
# Reference solution, run as the agent user (worker).
set -euo pipefail
mkdir -p /home/worker/notes
printf 'ship it\n' > /home/worker/notes/todo.txt
chmod 600 /home/worker/notes/todo.txt
