#!/bin/sh
# Runs a Python test script (tests/deploy/*.py) by its path in the runfiles
# tree: the scripts find their data beside themselves (os.path.dirname(__file__)),
# and an sh_test whose srcs is the script itself would run it as the target's
# name from the runfiles root instead.
# usage (sh_test args): $(rootpath SCRIPT.py) ARGS...
exec /usr/bin/python3 "$@"
