# Cross build for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu; its programs (the
# tests) run under qemu-user (Debian's qemu-user-static). Used by the arm64-qemu preset.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(ATTN_AARCH64_SYSROOT /usr/aarch64-linux-gnu)
# -L: where qemu finds the target's dynamic loader and libraries.
find_program(ATTN_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR "${ATTN_QEMU_AARCH64};-L;${ATTN_AARCH64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH "${ATTN_AARCH64_SYSROOT}")
# Programs (Python, the imported generators) come from the host; libraries and headers of
# the target from its sysroot, except packages (Halide's, found through the venv).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Halide's Python bindings are for the host's Python; a cross build has no use for them.
set(CMAKE_DISABLE_FIND_PACKAGE_Halide_Python ON)
