// The element types of pulled values (PullRequest.value_type, issue 17): the one place
// that says how many bytes each takes on the wire. Weights are stored in float32; the
// narrow types are produced and widened by common/base/half.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/ps.pb.h"

namespace ps {

// Bytes of one value of `type` on the wire (FLOAT32 4, BFLOAT16 and FLOAT16 2); 0 for a
// value this build does not know (a newer peer's enum, or garbage).
inline size_t ValueTypeBytes(int type) {
  switch (type) {
    case FLOAT32:
      return sizeof(float);
    case BFLOAT16:
    case FLOAT16:
      return sizeof(uint16_t);
    default:
      return 0;
  }
}

}  // namespace ps
