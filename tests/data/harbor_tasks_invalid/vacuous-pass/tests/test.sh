#!/bin/bash
# Defect on purpose: the check never looks at /app/done.txt, so it passes untouched.
echo 1 > /logs/verifier/reward.txt
