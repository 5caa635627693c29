#!/bin/bash
# Reward 1 when /app/answer.txt holds 42, else 0 (Harbor reads /logs/verifier/reward.txt).
# Also records what the sandbox was given: its working directory, user, memory limit, network,
# and how many `sleep` processes are left (a timed-out oracle's must have been killed).
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
echo "answer: $(cat /app/answer.txt 2>/dev/null || echo missing)"
{
  echo "pwd=$(pwd)"
  echo "user=$(id -un)"
  echo "memory_max=$(cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null | head -1)"
  echo "interfaces=$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')"
  echo "sleeping=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$')"
} > /logs/verifier/sandbox.txt
