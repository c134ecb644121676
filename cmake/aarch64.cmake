# Cross build for 64-bit ARM Linux with Debian's gcc-aarch64-linux-gnu; the
# tests run under qemu-user. Use with -DLMS_KERNELS_ONLY=ON (the upper layers
# need arm64 builds of pcre2, jansson and libwebsockets). See tools/check-neon.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# The cross glibc (libc6-arm64-cross, in /usr/aarch64-linux-gnu) must be the
# one loaded with its own ld.so: once multiarch arm64 packages are installed
# (libcmocka-dev:arm64 pulls in libc6:arm64), the loader would otherwise find
# /lib/aarch64-linux-gnu/libc.so.6 first, and the mismatched pair hangs in
# pthread_create. Other libraries still come from /usr/lib/aarch64-linux-gnu.
set(CMAKE_CROSSCOMPILING_EMULATOR
    "qemu-aarch64;-L;/usr/aarch64-linux-gnu;-E;LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib")

# Headers and libraries of the target only; programs of the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config: the multiarch arm64 .pc files (libcmocka-dev:arm64), not the
# host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "/")

# Debian puts arch-independent headers such as cmocka.h in /usr/include,
# which the cross compiler does not search; look there last, after the
# target's own headers.
set(CMAKE_C_FLAGS_INIT "-idirafter /usr/include")
