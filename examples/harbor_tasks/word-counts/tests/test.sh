#!/bin/bash
# Harbor verifier script: writes /logs/verifier/reward.json with the overall
# reward and a partial-credit metric.
python3 /tests/check_counts.py
