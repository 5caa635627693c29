#!/bin/bash
# Defect on purpose: far slower than [verifier].timeout_sec (2 s).
sleep 60
if [ "$(cat /app/done.txt 2>/dev/null)" = "done" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
