#!/bin/bash
# The oracle: computes the answer in the sandbox (relative path: the task's WORKDIR, /app).
set -e
read a b < numbers.txt
echo $((a * b)) > answer.txt
