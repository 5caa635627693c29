#!/bin/bash
# Harbor verifier script (runs as worker): the file must exist, hold the right
# content, be mode 600 and be owned by worker (so it was made as that user).
f=/home/worker/notes/todo.txt
ok=1
[ -f "$f" ] || { echo "missing $f"; ok=0; }
if [ "$ok" = 1 ]; then
  [ "$(cat "$f")" = "ship it" ] || { echo "wrong content"; ok=0; }
  [ "$(stat -c %a "$f")" = "600" ] || { echo "mode is $(stat -c %a "$f")"; ok=0; }
  [ "$(stat -c %U "$f")" = "worker" ] || { echo "owner is $(stat -c %U "$f")"; ok=0; }
fi
echo "$ok" > /logs/verifier/reward.txt
