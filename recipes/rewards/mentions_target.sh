#!/bin/sh
# A GRPO reward command (reward_funcs: external:sh recipes/rewards/mentions_target.sh): reads one JSON object per
# completion on stdin and prints 1 when the completion contains the row's "target" text, else 0, one line each.
# swiftcpp writes each object on one line with its keys sorted, so "completion" and "target" are found by pattern;
# a target holding a quote or a backslash is not supported here.
exec awk '{
  target = ""; completion = "";
  if (match($0, /"target":"[^"\\]*"/)) target = substr($0, RSTART + 10, RLENGTH - 11);
  if (match($0, /"completion":"([^"\\]|\\.)*"/)) completion = substr($0, RSTART + 14, RLENGTH - 15);
  print (target != "" && index(completion, target) > 0) ? 1 : 0;
}'
