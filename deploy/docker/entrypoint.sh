#!/bin/sh
# The image's entrypoint: hands numba the kernels compiled when the image was built, then runs the command
# (the chart's, the DaskCluster's and the gateway's commands are container args, so they pass through here).
#
# numba reads and writes its cache only in a directory it can write, and the deploy paths run the image
# with a read-only root filesystem and an empty /tmp volume: so the build's cache,
# /opt/dask-clust/numba-cache (DASK_CLUST_BUILT_KERNELS names another), is copied into NUMBA_CACHE_DIR (on
# /tmp) when that is empty. Without it every new pod would spend its first fit compiling, and its event loop
# would stall while it does. Nothing here stops the command from starting: a copy that fails only costs that.
set -e
built=${DASK_CLUST_BUILT_KERNELS:-/opt/dask-clust/numba-cache}
if [ -n "$NUMBA_CPU_NAME" ] && [ "$NUMBA_CPU_NAME" != generic ]; then
    # kernels built for x86-64-v3 would stop a CPU without these with SIGILL: compile for it instead
    for flag in avx2 fma bmi2 movbe f16c; do
        if ! grep -qw "$flag" /proc/cpuinfo; then
            echo "dask-clust: this CPU lacks $flag ($NUMBA_CPU_NAME): the kernels are compiled for it at first use" >&2
            unset NUMBA_CPU_NAME NUMBA_CPU_FEATURES
            built=
            break
        fi
    done
fi
if [ -n "$built" ] && [ -d "$built" ] && [ -n "$NUMBA_CACHE_DIR" ] && [ -z "$(ls -A "$NUMBA_CACHE_DIR" 2>/dev/null)" ]; then
    { mkdir -p "$NUMBA_CACHE_DIR" && cp -R "$built/." "$NUMBA_CACHE_DIR/"; } ||
        echo "dask-clust: could not copy the built kernels into $NUMBA_CACHE_DIR: the first fit compiles them" >&2
fi
exec "$@"
