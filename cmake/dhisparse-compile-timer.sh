#!/usr/bin/env bash
# Compiler launcher for dhisparse's own programs (DHISPARSE_COMPILE_TIMES): runs the compile command
# given after the log path and appends one line per translation unit to that log:
#   <cpu seconds>\t<wall seconds>\t<object file>
# CPU seconds are those of the compiler and every process it waited for (nvcc's cudafe++, cicc,
# ptxas, the host compiler): unlike wall time they barely change with the machine's load.
# scripts/check-compile-times reads the log.
log=$1
shift
start=$(date +%s.%N)
"$@"
rc=$?
end=$(date +%s.%N)
object=unknown
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then object=$arg; fi
  prev=$arg
done
# `times` prints the shell's user/system times, then those of its finished children. It must run in
# this shell (a pipe or $(...) would run it in a subshell, which has no children): via a file.
times_file=$(mktemp)
times >"$times_file"
children=$(tail -n 1 "$times_file")
rm -f "$times_file"
cpu=$(echo "$children" | awk '{ t = 0; for (i = 1; i <= 2; ++i) { split($i, p, "m"); sub("s", "", p[2]); t += p[1] * 60 + p[2] } printf "%.1f", t }')
wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
printf '%s\t%s\t%s\n' "$cpu" "$wall" "$object" >>"$log"
exit "$rc"
