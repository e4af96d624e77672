// CRC-32C (Castagnoli), as in iSCSI, ext4 and RocksDB: the checksum of export files.
// Uses the SSE4.2 instruction when the build targets it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ps {

// Extends `crc` (0 for a fresh checksum) over data[0..n). Crc32c(Crc32c(0, a), b) equals
// the checksum of a followed by b. Crc32c(0, "123456789", 9) == 0xe3069283.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace ps
