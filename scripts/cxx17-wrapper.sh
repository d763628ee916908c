#!/bin/sh
# C++ compiler wrapper used only while building Horovod 0.28.1 (see scripts/install.sh).
# 1. Horovod 0.28.1 compiles its torch extension as C++14; torch >= 2.1 headers need C++17.
#    The build strips -std= from CXXFLAGS, so the standard is appended here (with GCC the last wins).
# 2. horovod/tensorflow/xla_mpi_ops.cc does not compile against TF >= 2.16 headers; everything in it
#    but its includes is GPU-only XLA custom calls. Redefining TENSORFLOW_VERSION to 0 for that one
#    file compiles it to nothing. A GPU build loses only the optional XLA ops.
real_cxx="${HVDTRAIN_REAL_CXX:-g++}"
for arg in "$@"; do
  case "$arg" in
    *xla_mpi_ops.cc) exec "$real_cxx" "$@" -std=c++17 -UTENSORFLOW_VERSION -DTENSORFLOW_VERSION=0 ;;
  esac
done
exec "$real_cxx" "$@" -std=c++17
