#!/bin/bash
# Harbor verifier script (runs as worker): the file must exist, hold the right
# content, be mode 600 and be owned by worker (so it was made as that user).
f=/home/worker/notes/todo.txt
ok=1
[ -f "$f" ] || { echo "missing $f"; ok=0; }
if [ "$ok" = 1 ]; then
  # mode and owner through python3's os.stat (coreutils stat's statx fails under some gVisor releases)
  read -r mode owner < <(python3 -c 'import os, pwd, stat, sys; s = os.stat(sys.argv[1]); print(oct(stat.S_IMODE(s.st_mode))[2:], pwd.getpwuid(s.st_uid).pw_name)' "$f")
  [ "$(cat "$f")" = "ship it" ] || { echo "wrong content"; ok=0; }
  [ "$mode" = "600" ] || { echo "mode is $mode"; ok=0; }
  [ "$owner" = "worker" ] || { echo "owner is $owner"; ok=0; }
fi
echo "$ok" > /logs/verifier/reward.txt
