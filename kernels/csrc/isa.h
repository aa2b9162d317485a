// The ISA ceiling of the kernel plan (kernels/plan.py): BRISK_ISA=avx2|avx512|vnni|amx caps the
// paths chosen at run time, and BRISK_KERNELS=portable takes none of them. Read once, from the
// same variables the plan reads, before any kernel picks a path (each caches its answer).
#pragma once

#include <cstdlib>
#include <strings.h>

namespace brisk {

enum Isa { kIsaPortable = 0, kIsaAvx2 = 1, kIsaAvx512 = 2, kIsaVnni = 3, kIsaAmx = 4, kIsaAny = 99 };

inline int isa_ceiling() {
  static const int ceiling = [] {
    const char* mode = std::getenv("BRISK_KERNELS");
    if (mode && strcasecmp(mode, "portable") == 0) return int(kIsaPortable);
    const char* isa = std::getenv("BRISK_ISA");
    if (!isa || !*isa) return int(kIsaAny);
    if (strcasecmp(isa, "avx2") == 0) return int(kIsaAvx2);
    if (strcasecmp(isa, "avx512") == 0) return int(kIsaAvx512);
    if (strcasecmp(isa, "vnni") == 0) return int(kIsaVnni);
    if (strcasecmp(isa, "amx") == 0) return int(kIsaAmx);
    return int(kIsaAny);  // the plan warns about an unknown value and sets no ceiling either
  }();
  return ceiling;
}

inline bool isa_allows(Isa level) { return isa_ceiling() >= level; }

}  // namespace brisk
