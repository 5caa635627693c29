"""Compare /data/counts.json with the counts recomputed from /data/input.txt."""

import collections
import json
import re

with open("/data/input.txt", encoding="utf-8") as fh:
    expected = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", fh.read()))

try:
    with open("/data/counts.json", encoding="utf-8") as fh:
        got = json.load(fh)
except (OSError, ValueError) as exc:
    print(f"counts.json unreadable: {exc}")
    got = None

if isinstance(got, dict):
    right = sum(1 for word, n in expected.items() if got.get(word) == n)
    exact = got == dict(expected)
else:
    right, exact = 0, False

print(f"{right}/{len(expected)} words right; exact={exact}")
with open("/logs/verifier/reward.json", "w", encoding="utf-8") as fh:
    json.dump({"reward": 1 if exact else 0, "words_right": right / len(expected)}, fh)
