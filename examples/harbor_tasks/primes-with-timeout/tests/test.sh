#!/bin/bash
# Harbor verifier script. PRIME_LIMIT comes from [verifier].env in task.toml.
cd /app
if timeout 10 python /tests/check_primes.py "${PRIME_LIMIT:?PRIME_LIMIT not set}"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
