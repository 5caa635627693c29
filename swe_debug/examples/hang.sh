#!/bin/bash
# A debug script that never finishes: the run must report `timeout` at --debug-timeout
# and leave nothing running behind.
echo "starting a debug step that hangs"
sleep 3600
