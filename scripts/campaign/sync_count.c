// Counts the CUDA runtime calls that make the host wait for the GPU, in a process started with
// LD_PRELOAD=sync_count.so (no Nsight Systems needed): stream, device and event synchronizations,
// blocking cudaMemcpy, and cudaMemcpyAsync by direction, device-to-host copies split by whether
// the host buffer is pinned (into pageable memory such a copy returns only once it is done, so it
// is a host sync too). Every call is passed on unchanged to the real runtime.
// At exit the counts go, as one JSON object, to the file $ULYSSES_SYNC_COUNT_OUT ("%p" in it is
// replaced by the process id); nothing is written when that variable is unset. A process that
// never loads the CUDA runtime (a CPU build) writes zeros.
// Build: cc -O2 -shared -fPIC -o sync_count.so sync_count.c -ldl
// The runtime's types are declared here by their ABI (cudaError_t and enums are ints, streams and
// events are pointers), so no CUDA header is needed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int cuda_error;
enum { kHostToDevice = 1, kDeviceToHost = 2, kDefault = 4 };  // cudaMemcpyKind
enum { kUnregistered = 0, kHost = 1 };                         // cudaMemoryType

enum Counter {
  kStreamSync, kDeviceSync, kEventSync, kMemcpyBlocking, kAsyncD2hPageable, kAsyncD2hPinned,
  kAsyncH2d, kAsyncDefault, kCounters
};
static const char* const kNames[kCounters] = {
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpyAsync_d2h_pageable", "cudaMemcpyAsync_d2h_pinned", "cudaMemcpyAsync_h2d",
    "cudaMemcpyAsync_default"};
static atomic_long counts[kCounters];

// cudaPointerAttributes (CUDA >= 11): the memory type comes first.
struct pointer_attributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
};

typedef cuda_error (*handle_fn)(void*);
typedef cuda_error (*void_fn)(void);
typedef cuda_error (*memcpy_fn)(void*, const void*, size_t, int);
typedef cuda_error (*memcpy_async_fn)(void*, const void*, size_t, int, void*);
typedef cuda_error (*attributes_fn)(struct pointer_attributes*, const void*);

static void* real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == NULL) {
    fprintf(stderr, "sync_count: %s not found after this library\n", name);
    abort();
  }
  return f;
}

#define REAL(name, type)                        \
  static type real_##name = NULL;               \
  if (real_##name == NULL) real_##name = (type)real(#name)

cuda_error cudaStreamSynchronize(void* stream) {
  REAL(cudaStreamSynchronize, handle_fn);
  atomic_fetch_add(&counts[kStreamSync], 1);
  return real_cudaStreamSynchronize(stream);
}

cuda_error cudaDeviceSynchronize(void) {
  REAL(cudaDeviceSynchronize, void_fn);
  atomic_fetch_add(&counts[kDeviceSync], 1);
  return real_cudaDeviceSynchronize();
}

cuda_error cudaEventSynchronize(void* event) {
  REAL(cudaEventSynchronize, handle_fn);
  atomic_fetch_add(&counts[kEventSync], 1);
  return real_cudaEventSynchronize(event);
}

cuda_error cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  REAL(cudaMemcpy, memcpy_fn);
  atomic_fetch_add(&counts[kMemcpyBlocking], 1);
  return real_cudaMemcpy(dst, src, bytes, kind);
}

// Whether `host` is page-locked memory the runtime knows. An error from the query (none is
// expected on CUDA >= 11) is cleared again unless one was pending before, so the caller's own
// error checks see what they would have seen.
static int is_pinned(const void* host) {
  REAL(cudaPointerGetAttributes, attributes_fn);
  REAL(cudaPeekAtLastError, void_fn);
  REAL(cudaGetLastError, void_fn);
  const cuda_error pending = real_cudaPeekAtLastError();
  struct pointer_attributes attributes;
  memset(&attributes, 0, sizeof attributes);
  if (real_cudaPointerGetAttributes(&attributes, host) != 0) {
    if (pending == 0) real_cudaGetLastError();
    return 0;
  }
  return attributes.type == kHost;
}

cuda_error cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  REAL(cudaMemcpyAsync, memcpy_async_fn);
  if (kind == kDeviceToHost) {
    atomic_fetch_add(&counts[is_pinned(dst) ? kAsyncD2hPinned : kAsyncD2hPageable], 1);
  } else if (kind == kHostToDevice) {
    atomic_fetch_add(&counts[kAsyncH2d], 1);
  } else if (kind == kDefault) {
    atomic_fetch_add(&counts[kAsyncDefault], 1);
  }
  return real_cudaMemcpyAsync(dst, src, bytes, kind, stream);
}

__attribute__((destructor)) static void write_counts(void) {
  const char* pattern = getenv("ULYSSES_SYNC_COUNT_OUT");
  if (pattern == NULL || *pattern == '\0') return;
  char path[4096];
  const char* mark = strstr(pattern, "%p");
  if (mark != NULL) {
    snprintf(path, sizeof path, "%.*s%ld%s", (int)(mark - pattern), pattern, (long)getpid(),
             mark + 2);
  } else {
    snprintf(path, sizeof path, "%s", pattern);
  }
  FILE* out = fopen(path, "w");
  if (out == NULL) return;
  fprintf(out, "{");
  for (int i = 0; i < kCounters; ++i) {
    fprintf(out, "%s\"%s\": %ld", i ? ", " : "", kNames[i], atomic_load(&counts[i]));
  }
  fprintf(out, "}\n");
  fclose(out);
}
