#!/bin/sh
# The compiler launcher CMakeLists.txt sets where ccache is installed: ccache with
#  - base_dir at this checkout, so paths under it hash as relative ones and clones at
#    other paths (CI's) share objects; every compile line must then be free of
#    absolute paths under the checkout (the paths the tests need live in one
#    generated file, tests/test_paths.h). A target with a precompiled header shares
#    them only between trees whose .gch came from the cache: GCC writes the tree's
#    absolute paths into a .gch, and ccache hashes it into every file compiled with
#    it (measured: a clone restores the PCH another clone stored, then hits its
#    objects; the checkout that compiled its own PCH first does not match them);
#  - the sloppiness a precompiled header needs (ccache's manual, "Precompiled headers").
# A value the caller exports wins.
root=$(cd "$(dirname "$0")/.." && pwd)
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
exec ccache "$@"
