#!/bin/bash
# Harbor verifier script: run the checks and write the reward (1 pass, 0 fail).
cd /app
if python -m pytest -q -p no:cacheprovider /tests/test_stats.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
