#!/bin/bash
# Defect on purpose: writes the wrong content.
echo "not done" > /app/done.txt
