#!/bin/sh
# The compiler launcher CMakeLists.txt sets where ccache is installed: ccache with
#  - base_dir at this checkout, so paths under it hash as relative ones and a second
#    clone (CI's, a worktree) reuses this one's objects; every compile line and
#    header must then be free of absolute paths under the checkout (the paths the
#    tests need live in one generated file, tests/test_paths.h);
#  - the sloppiness a precompiled header needs (ccache's manual, "Precompiled headers").
# A value the caller exports wins.
root=$(cd "$(dirname "$0")/.." && pwd)
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
exec ccache "$@"
