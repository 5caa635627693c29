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
  # live sleep processes (a zombie is dead: it waits only to be reaped); the timed-out
  # command's group is killed by the agent as the timeout's cancel reaches it, which can
  # land just after this script starts on a loaded machine: look for up to 5 s
  for _ in $(seq 50); do
    n=0
    for p in /proc/[0-9]*; do
      [ "$(cat "$p/comm" 2>/dev/null)" = sleep ] && ! grep -q '^State:[[:space:]]*Z' "$p/status" 2>/dev/null && n=$((n + 1))
    done
    [ "$n" -eq 0 ] && break
    sleep 0.1
  done
  echo "sleeping=$n"
} > /logs/verifier/sandbox.txt
