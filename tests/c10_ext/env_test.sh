#!/bin/sh
# The environment route: an unmodified libtorch program under LD_PRELOAD=libmetaload.so.
# usage: env_test.sh <env_program> <libmetaload.so>
set -u
prog=$1
lib=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
fail=0
check() { # name, condition-result
  if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
unset METALOAD METALOAD_REPORT LD_PRELOAD

out=$(LD_PRELOAD=$lib METALOAD=meta METALOAD_REPORT=1 "$prog" 2>/tmp/env_test_err.$$)
rc=$?
err=$(cat /tmp/env_test_err.$$)
echo "meta: $out"
echo "meta stderr: $err"
check "METALOAD=meta runs" "$rc"
echo "$out" | grep -q "device=meta params=419532800"; check "METALOAD=meta builds 1.6 GB of Linear layers on meta" $?
growth=$(echo "$out" | sed 's/.*rss_growth=\([0-9-]*\).*/\1/')
[ "$growth" -lt 33554432 ]; check "RSS grows by less than 32 MB (grew $growth bytes)" $?
echo "$err" | grep -q "^metaload: 50 tensors forced onto meta; 1677721600 bytes"; check "METALOAD_REPORT=1 prints the summary line (weights; the small biases get host shadows)" $?

out=$(LD_PRELOAD=$lib METALOAD=off "$prog" 2>&1); rc=$?
echo "off: $out"
check "METALOAD=off runs" "$rc"
echo "$out" | grep -q "^device=cpu params=419532800"; check "METALOAD=off has no effect" $?

out=$(LD_PRELOAD=$lib "$prog" 2>&1); rc=$?
echo "$out" | grep -q "^device=cpu"; check "METALOAD unset has no effect" $?

out=$(LD_PRELOAD=$lib METALOAD= METALOAD_REPORT= "$prog" 2>&1); rc=$?
echo "empty: $out"
check "METALOAD= (empty) runs" "$rc"
echo "$out" | grep -q "^device=cpu params=419532800"; check "an empty METALOAD (and METALOAD_REPORT) has no effect, as unset" $?
echo "$out" | grep -q "^metaload:"; [ $? != 0 ]; check "an empty METALOAD_REPORT prints no summary" $?

out=$(LD_PRELOAD=$lib METALOAD=Meta "$prog" 2>&1); rc=$?
echo "bad value: $out (exit $rc)"
[ "$rc" = 2 ]; check "an invalid METALOAD stops the process with exit code 2" $?
echo "$out" | grep -q "METALOAD='Meta' is not valid: accepted values are 'meta'.*'off', empty or unset"; check "the message names the variable, the value and the accepted values" $?
echo "$out" | grep -q "device="; [ $? != 0 ]; check "nothing of the program ran" $?
rm -f /tmp/env_test_err.$$
exit $fail
