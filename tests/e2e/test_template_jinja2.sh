#!/usr/bin/env bash
# test_template_jinja2.sh - `lmserv template` against Python's jinja2 on many
# conversations per real template (template_jinja2.py says how).
. "$(dirname "$0")/lib.sh" || exit 1
command -v python3 >/dev/null || skip "python3 is not installed"
python3 -c 'import jinja2' 2>/dev/null || skip "python3-jinja2 is not installed"
export LMSERV LMS_TESTDATA
exec python3 "$E2E_DIR/template_jinja2.py" "$@"
