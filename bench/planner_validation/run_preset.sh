#!/bin/bash
name=$1; shift
cd /work/wt-planner
echo "$name start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/planner_val/log
./build/sluice bench --preset mixtral-8x7b --layers 4 --threads 1 --ignore-eos "$@" --json > /tmp/planner_val/$name.json 2>/tmp/planner_val/$name.err
echo "$name end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/planner_val/log
