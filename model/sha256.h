// SHA-256 (FIPS 180-4), for naming hub-cache blobs the way the Hugging Face hub names them: the
// hex digest of the file's bytes. Torch-free, dependency-free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace metaload {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The 64 lowercase hex digits; the object is spent afterwards.
  std::string hex_digest();

 private:
  void block(const unsigned char* p);

  std::array<uint32_t, 8> h_;
  unsigned char buf_[64];
  size_t used_ = 0;
  uint64_t bytes_ = 0;
};

// The SHA-256 of a string's bytes, as 64 lowercase hex digits.
std::string sha256_hex(const std::string& bytes);

}  // namespace metaload
