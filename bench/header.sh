# Sourced by the bench scripts: the machine line every results page starts with.
machine() {
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"
  echo "libtorch $(dpkg-query -W -f='${Version}' libtorch-dev), OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo '?')"
}
