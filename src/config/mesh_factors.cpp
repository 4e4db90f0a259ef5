// SP factorization rules (see mesh_factors.h).
#include "config/mesh_factors.h"

namespace ulysses::config {

bool heads_split_evenly(int64_t hq, int64_t hkv, int64_t sp) {
  return hq % sp == 0 && (hkv % sp == 0 || sp % hkv == 0);
}

bool heads_allow_a2a(int64_t hq, int64_t hkv, int64_t sp_a2a, bool uneven_heads) {
  if (heads_split_evenly(hq, hkv, sp_a2a)) return true;
  return uneven_heads && sp_a2a <= hq && hq % hkv == 0;
}

int64_t resolved_sp_ring(const MeshOptions& mesh, int64_t hq, int64_t hkv) {
  if (!mesh.sp_ring.is_auto()) return mesh.sp_ring.value;
  for (int64_t a2a = mesh.sp; a2a > 1; --a2a) {
    if (mesh.sp % a2a == 0 && heads_allow_a2a(hq, hkv, a2a, mesh.uneven_heads)) {
      return mesh.sp / a2a;
    }
  }
  return mesh.sp;
}

int64_t sequence_multiple(int64_t sp, int64_t sp_ring) { return sp_ring > 1 ? 2 * sp : sp; }

}  // namespace ulysses::config
