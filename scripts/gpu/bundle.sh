#!/usr/bin/env bash
# Builds the CUDA binaries HERE (Debian, where our libraries are) and packs them, with every shared library
# they need except glibc, the CUDA driver and the CUDA toolkit's own libraries, into gpu-bundle/ (ignored), for
# a lent GPU machine that has CUDA but none of our dependencies (OpenMPI, oneDNN, yaml-cpp, spdlog, fmt).
#
# How a session with a GPU uses it:
#   scripts/gpu/bundle.sh                                 # here: build-gpu, then gpu-bundle/gpt-bundle.tar.xz
#   device tool `run`: carry ["gpu-bundle"], command "scripts/gpu/check.sh", timeout_s 540
# check.sh extracts the tarball to /tmp/gpt-bundle and sources its env.sh. By hand on any machine:
#   tar -xJf gpu-bundle/gpt-bundle.tar.xz -C /tmp && source /tmp/gpt-bundle/env.sh
#   gpt_tests "[cuda]"; gpt_mpi_tests "[nccl]"   # singletons: no mpirun in the bundle
#   cd /tmp/gpt-bundle && gpt-train train -c configs/shakespeare-char-cpu.yaml --set run.device=cuda
#
# Environment: BUILD_DIR (build-gpu), JOBS (2), CUDA_ARCHS (CMake's default here: 80;90), SKIP_BUILD=1 to pack
# what is already built, VERIFY=0 to skip the checks at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD_DIR:-build-gpu}
OUT_DIR=$ROOT/gpu-bundle
TARBALL=$OUT_DIR/gpt-bundle.tar.xz
MPI_PLUGINS=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
MPI_SHARE=/usr/share/openmpi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  arch=()
  [ -n "${CUDA_ARCHS:-}" ] && arch=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPT_CUDA=ON "${arch[@]}" > /dev/null
  cmake --build "$BUILD" -j "${JOBS:-2}" --target gpt-train gpt_tests gpt_mpi_tests attention_bench
fi
BINS=("$BUILD/gpt-train" "$BUILD/tests/gpt_tests" "$BUILD/tests/comm/gpt_mpi_tests" "$BUILD/attention_bench")
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "bundle.sh: $b is missing" >&2; exit 1; }; done
# GPT_CUDA=ON or AUTO with nvcc found: either way the binary links the CUDA runtime.
# (grep without -q reads all of ldd's output: under pipefail, a grep -q that stops at its first match can leave ldd
# writing into a closed pipe, and the pipeline then fails with SIGPIPE although the line was found.)
ldd "$BUILD/gpt-train" | grep libcudart > /dev/null || { echo "bundle.sh: $BUILD is not a CUDA build" >&2; exit 1; }

# The char-level Shakespeare data (data/ is ignored, so it travels only inside the bundle).
if [ ! -f data/shakespeare_char/train.bin ]; then
  "$BUILD/gpt-train" prepare --input ../shared/data/tinyshakespeare.txt --tokenizer char --val-fraction 0.1 \
    --out data/shakespeare_char
fi

STAGE=$(mktemp -d /tmp/gpt-bundle-stage.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/gpt-bundle
mkdir -p "$B/bin" "$B/lib/openmpi" "$B/lib/compat" "$B/share/openmpi" "$B/data"
cp "${BINS[@]}" "$B/bin/"
cp -r configs "$B/configs"
cp -r data/shakespeare_char "$B/data/"
cp -r "$MPI_SHARE"/. "$B/share/openmpi/"  # help-*.txt and friends (~0.5 MB): readable errors instead of bare codes

# OpenMPI components: all but those that need UCX, libfabric, verbs, PSM, the external PMIx or OpenSHMEM (none
# is used by a singleton with pml ob1 and btl self,vader; leaving them out keeps their big dependencies out).
skip='_(atomic|memheap|scoll|spml|sshmem)_|_ucx\.so|_ofi\.so|_openib\.so|_psm2?\.so|_pmix_ext3x\.so'
for f in "$MPI_PLUGINS"/*.so; do
  [[ $(basename "$f") =~ $skip ]] || cp "$f" "$B/lib/openmpi/"
done

# Every library the binaries and the kept components load, except glibc, the driver and CUDA's own (the GPU
# machine has those, newer). libstdc++/libgcc_s go to lib/compat, which env.sh uses only where the system's
# are missing or too old (a newer system libstdc++ must win: CUDA's pip libraries may need its newer symbols).
exclude='^(linux-vdso|ld-linux[a-z0-9_-]*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|libnsl|libcuda|libnvidia-[a-z-]*|libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink|libcurand|libcufft|libcusparse|libcusolver|libnvToolsExt|libcupti)\.'
missing=0
while read -r name path; do
  [[ $name =~ $exclude ]] && continue
  if [ "$path" = "not" ] || [ ! -f "$path" ]; then echo "bundle.sh: $name not found" >&2; missing=1; continue; fi
  case $name in libstdc++.so.*|libgcc_s.so.*) dest=$B/lib/compat ;; *) dest=$B/lib ;; esac
  cp -L "$path" "$dest/$name"
done < <(for f in "${BINS[@]}" "$B"/lib/openmpi/*.so; do ldd "$f"; done |
         awk '$2 == "=>" {print $1, $3}' | sort -u)
[ "$missing" = 0 ] || exit 1
# CUDA's libraries must not be in the bundle (they come from the GPU machine's toolkit or its pip packages).
if ls "$B/lib" | grep -E '^lib(cudart|cublas|nccl)' > /dev/null; then echo "bundle.sh: a CUDA library slipped in" >&2; exit 1; fi
strip --strip-unneeded "$B"/lib/*.so* "$B"/lib/compat/*.so* "$B"/lib/openmpi/*.so 2>/dev/null || true

cat > "$B/env.sh" <<'EOF'
# Sourced: sets up a shell to run the bundle's binaries (bin/) with its libraries (lib/) on a machine that has
# CUDA but not our dependencies. Paths are relative to this file, so the bundle can be extracted anywhere.
GPT_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GPT_BUNDLE
_gpt_cuda=""
for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [ -d "$_d" ] && _gpt_cuda="$_gpt_cuda:$_d"
done
# Fallback for libraries the toolkit folder lacks (NCCL above all): the nvidia-* pip packages of the machine's
# python (torch's), e.g. site-packages/nvidia/nccl/lib, nvidia/cu13/lib.
for _py in python3 /opt/torch/.venv/bin/python3; do
  _nv=$("$_py" -c 'import nvidia, sys; print("\n".join(nvidia.__path__))' 2>/dev/null) || continue
  while read -r _d; do
    [ -n "$_d" ] && _gpt_cuda="$_gpt_cuda:$_d"
  done < <(for _p in $_nv; do find "$_p" -maxdepth 3 -name 'lib*.so*' -printf '%h\n' 2>/dev/null; done | sort -u)
  break
done
export LD_LIBRARY_PATH="$GPT_BUNDLE/lib$_gpt_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libstdc++/libgcc_s from the build machine, only where the system's are missing or lack a version we need.
# (grep reads all of ldd's output: a grep -q stopping early could fail the pipeline by SIGPIPE under pipefail.)
if [ "${GPT_BUNDLE_COMPAT:-}" = 1 ] || ldd "$GPT_BUNDLE/bin/gpt-train" 2>&1 | grep -E 'lib(stdc\+\+|gcc_s).*not found' > /dev/null; then
  export LD_LIBRARY_PATH="$GPT_BUNDLE/lib:$GPT_BUNDLE/lib/compat:${LD_LIBRARY_PATH#"$GPT_BUNDLE/lib:"}"
fi
# OpenMPI, relocated: components and help files from the bundle; a singleton (no mpirun, no orted).
export OPAL_PREFIX="$GPT_BUNDLE" OPAL_PKGDATADIR="$GPT_BUNDLE/share/openmpi" OPAL_DATADIR="$GPT_BUNDLE/share"
export OPAL_SYSCONFDIR="$GPT_BUNDLE/etc"  # no openmpi-mca-params.conf: the same settings on every machine
export OMPI_MCA_mca_base_component_path="$GPT_BUNDLE/lib/openmpi"
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HWLOC_PLUGINS_PATH="$GPT_BUNDLE/lib/hwloc"  # none: hwloc's built-in discovery only
export PATH="$GPT_BUNDLE/bin:$PATH"
unset _gpt_cuda _d _py _nv _p
EOF

mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/gpt-bundle.tar.*
tar -C "$STAGE" -cf - gpt-bundle | xz -T2 -6 > "$TARBALL"
grep -qx '/gpu-bundle/' .gitignore || echo "bundle.sh: warning: /gpu-bundle/ is not in .gitignore" >&2

if [ "${VERIFY:-1}" = 1 ]; then
  # Checks on this machine with a bare environment: every library outside glibc and CUDA resolves into the
  # bundle, OpenMPI loads its components from it, and the binaries run.
  V=$(mktemp -d /tmp/gpt-bundle-verify.XXXXXX)
  tar -xJf "$TARBALL" -C "$V"
  run() { env -i PATH=/usr/bin:/bin HOME=/tmp ${COMPAT:+GPT_BUNDLE_COMPAT=1} bash -c "source $V/gpt-bundle/env.sh; cd $V/gpt-bundle; $1"; }
  stray() {  # libraries that resolve outside the bundle, but glibc and CUDA (and, here, libstdc++/libgcc_s)
    run 'for f in bin/* lib/*.so* lib/openmpi/*.so; do ldd $f; done' | awk '$2 == "=>" {print $1, $3}' |
      grep -vE "$exclude" | grep -v " $V/gpt-bundle/" | grep -vE "${1:-^$}" | sort -u || true
  }
  s=$(stray '^lib(stdc\+\+|gcc_s)\.')  # the system's are found and new enough here, so env.sh leaves compat out
  [ -z "$s" ] || { echo "bundle.sh: libraries resolved outside the bundle:"; echo "$s"; exit 1; }
  s=$(COMPAT=1 stray)  # where they are missing or too old, lib/compat serves them
  [ -z "$s" ] || { echo "bundle.sh: with GPT_BUNDLE_COMPAT=1, resolved outside the bundle:"; echo "$s"; exit 1; }
  COMPAT=1 run 'bin/gpt_tests "[config]"' | tail -1
  # Every object the dynamic linker initialises (dlopen'ed OpenMPI components too), by path.
  loads=$(run 'LD_DEBUG=libs bin/gpt_mpi_tests "[nccl]" 2>&1 >/dev/null' | grep -o 'calling init: [^ ]*' | cut -d' ' -f3 | sort -u)
  outside=$(grep -v "^$V/gpt-bundle/" <<< "$loads" | grep -vE "/($(tr -d '^' <<< "${exclude%\\.}"))\.|/lib(stdc\+\+|gcc_s)\." || true)
  [ -z "$outside" ] || { echo "bundle.sh: loaded from outside the bundle:"; echo "$outside"; exit 1; }
  echo "bundle.sh: $(wc -l <<< "$loads") objects loaded, $(grep -c "^$V/gpt-bundle/" <<< "$loads") from the bundle; the others:" \
    $(grep -v "^$V/gpt-bundle/" <<< "$loads" | xargs -n1 basename | tr '\n' ' ')
  grep -q "^$V/gpt-bundle/lib/openmpi/mca_ess_singleton.so" <<< "$loads" ||
    { echo "bundle.sh: OpenMPI did not load its components from the bundle" >&2; exit 1; }
  run 'bin/gpt_tests "[config]"' | tail -2
  run 'bin/gpt_mpi_tests "[nccl]"' | grep -E "SKIPPED|passed|failed"
  run 'bin/gpt-train train -c configs/shakespeare-char-cpu.yaml --set training.steps=3 --set training.eval_batches=1 \
       --set run.out_dir=/tmp/gpt-bundle-verify-run --set run.threads=2 2>&1' | tail -2
  run 'bin/attention_bench --device cpu --dtype fp32 --batch 1 --seq 32 --embd 32 --heads 2 --iters 1' | tail -1
  rm -rf "$V" /tmp/gpt-bundle-verify-run
  echo "bundle.sh: verified (libraries and OpenMPI components from the bundle; config tests, singleton MPI, 3 steps," \
    "attention_bench)"
fi
echo "bundle: $TARBALL $(du -h "$TARBALL" | cut -f1) ($(du -b "$TARBALL" | cut -f1) bytes)"
