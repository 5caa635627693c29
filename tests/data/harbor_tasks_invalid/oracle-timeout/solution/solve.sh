#!/bin/bash
# Defect on purpose: far slower than [agent].timeout_sec.
sleep 60
echo done > /app/done.txt
