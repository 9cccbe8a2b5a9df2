// Shared definitions for kvcore's kernels. Prepended to every .cu source by
// src/gpu/kernels.rs before NVRTC compiles it (NVRTC has no file system here).

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;
