#!/usr/bin/env bash
# Installs kvcore for C and C++ users under a prefix:
#
#   packaging/install.sh --prefix /usr/local
#
#   PREFIX/lib/libkvcore.so.X.Y.Z            the shared library, soname libkvcore.so.0.Y (0.x) or .so.X
#   PREFIX/lib/libkvcore.so.<soname version> and libkvcore.so, links to it
#   PREFIX/lib/libkvcore.a                   the static library
#   PREFIX/include/kvcore.h, kvcore.hpp      the C header and the C++ wrapper
#   PREFIX/lib/pkgconfig/kvcore.pc           pkg-config: `pkg-config --cflags --libs kvcore`
#                                            (`--static` adds what the static library needs)
#   PREFIX/lib/cmake/kvcore/                 CMake: find_package(kvcore) gives kvcore::kvcore
#                                            (shared) and kvcore::kvcore_static
#
# It builds the library first (`cargo build --release --locked -p kvcore --lib`, honouring
# CARGO_TARGET_DIR). --artifacts DIR installs libkvcore.so and libkvcore.a from DIR instead of
# building (tests/install.rs uses the ones its own build made). --libdir NAME (default lib) names
# the library folder under the prefix, e.g. lib64. DESTDIR is honoured for staged installs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prefix=""
artifacts=""
libdir_name="lib"
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="$2"; shift 2 ;;
        --prefix=*) prefix="${1#--prefix=}"; shift ;;
        --artifacts) artifacts="$2"; shift 2 ;;
        --artifacts=*) artifacts="${1#--artifacts=}"; shift ;;
        --libdir) libdir_name="$2"; shift 2 ;;
        --libdir=*) libdir_name="${1#--libdir=}"; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$prefix" ]; then
    echo "install.sh: --prefix DIR is required" >&2
    exit 2
fi
case "$prefix" in
    /*) ;;
    *) prefix="$(pwd)/$prefix" ;;
esac

version="$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -n1)"
major="${version%%.*}"
rest="${version#*.}"
minor="${rest%%.*}"
if [ "$major" = "0" ]; then sover="0.$minor"; else sover="$major"; fi

if [ -z "$artifacts" ]; then
    (cd "$root" && cargo build --release --locked -p kvcore --lib)
    target_dir="${CARGO_TARGET_DIR:-$root/target}"
    case "$target_dir" in
        /*) ;;
        *) target_dir="$root/$target_dir" ;;
    esac
    artifacts="$target_dir/release"
fi
for f in libkvcore.so libkvcore.a; do
    [ -f "$artifacts/$f" ] || { echo "install.sh: no $f in $artifacts" >&2; exit 1; }
done
soname="$(readelf -d "$artifacts/libkvcore.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
if [ -n "$soname" ] && [ "$soname" != "libkvcore.so.$sover" ]; then
    echo "install.sh: $artifacts/libkvcore.so has soname $soname, expected libkvcore.so.$sover" >&2
    exit 1
fi

dest="${DESTDIR:-}$prefix"
libdir="$dest/$libdir_name"
install -d "$libdir/pkgconfig" "$libdir/cmake/kvcore" "$dest/include"
install -m 0755 "$artifacts/libkvcore.so" "$libdir/libkvcore.so.$version"
ln -sf "libkvcore.so.$version" "$libdir/libkvcore.so.$sover"
ln -sf "libkvcore.so.$sover" "$libdir/libkvcore.so"
install -m 0644 "$artifacts/libkvcore.a" "$libdir/libkvcore.a"
install -m 0644 "$root/include/kvcore.h" "$root/include/kvcore.hpp" "$dest/include/"

# What a Rust static library needs from the system on Linux; the C++ runtime is for the
# bundled libzmq.
private_libs="-lpthread -ldl -lm -lrt -lstdc++"
cat > "$libdir/pkgconfig/kvcore.pc" <<PC
prefix=$prefix
libdir=\${prefix}/$libdir_name
includedir=\${prefix}/include

Name: kvcore
Description: KV-cache core of an LLM serving engine (C API, C++ wrapper kvcore.hpp)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lkvcore
Libs.private: $private_libs
PC

cat > "$libdir/cmake/kvcore/kvcoreConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif("$major" STREQUAL "0" AND NOT PACKAGE_FIND_VERSION_MINOR EQUAL "$minor")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(NOT "$major" STREQUAL "0" AND NOT PACKAGE_FIND_VERSION_MAJOR EQUAL "$major")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

cat > "$libdir/cmake/kvcore/kvcoreConfig.cmake" <<'CMAKE'
# kvcore: find_package(kvcore) defines kvcore::kvcore (the shared library) and
# kvcore::kvcore_static (the static one, with the system libraries it needs).
get_filename_component(_kvcore_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
find_package(Threads REQUIRED)
if(NOT TARGET kvcore::kvcore)
  add_library(kvcore::kvcore SHARED IMPORTED)
  set_target_properties(kvcore::kvcore PROPERTIES
    IMPORTED_LOCATION "${_kvcore_prefix}/@LIBDIR@/libkvcore.so.@SOVER@"
    IMPORTED_SONAME "libkvcore.so.@SOVER@"
    INTERFACE_INCLUDE_DIRECTORIES "${_kvcore_prefix}/include")
endif()
if(NOT TARGET kvcore::kvcore_static)
  add_library(kvcore::kvcore_static STATIC IMPORTED)
  set_target_properties(kvcore::kvcore_static PROPERTIES
    IMPORTED_LOCATION "${_kvcore_prefix}/@LIBDIR@/libkvcore.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_kvcore_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;dl;m;rt;stdc++")
endif()
unset(_kvcore_prefix)
CMAKE
sed -i -e "s|@LIBDIR@|$libdir_name|g" -e "s|@SOVER@|$sover|g" "$libdir/cmake/kvcore/kvcoreConfig.cmake"
echo "kvcore $version installed under $dest"
