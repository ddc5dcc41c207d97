#!/bin/sh
# The man page renders without warnings and documents every option --help lists.
. "$top_srcdir/tests/lib.sh"
man="$top_srcdir/man/tpinfer.1"
command -v groff >/dev/null || skip "groff not installed"
groff -man -Tutf8 -ww -P-cbou "$man" >"$TMP/page" 2>"$TMP/warn" || fail "groff failed"
[ -s "$TMP/warn" ] && { cat "$TMP/warn"; fail "groff warnings in tpinfer.1"; }
"$TPINFER" --help | grep -o -- '--[a-z][a-z-]*' | sort -u >"$TMP/flags"
[ -s "$TMP/flags" ] || fail "no flags in --help"
missing=0
while read -r flag; do
    # each option has its own entry: a line that starts with it (after the indent)
    grep -Eq -- "^ +(-[A-Za-z], )?(--[a-z-]+, )?$flag( |,|$)" "$TMP/page" || { echo "man page has no entry for $flag"; missing=1; }
done <"$TMP/flags"
[ $missing -eq 0 ] || fail "man/tpinfer.1 is missing options"
exit 0
