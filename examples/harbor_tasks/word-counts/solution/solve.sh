#!/bin/bash
# Reference solution: count words with tr/sort/uniq, emit JSON with python3.
set -euo pipefail
tr -cs 'A-Za-z' '\n' < /data/input.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
  | python3 -c 'import json, sys; print(json.dumps({w: int(n) for n, w in (l.split() for l in sys.stdin)}))' \
  > /data/counts.json
