// The tensor-parallel handshake: before a rank loads or runs anything, every rank of the group
// tells every other its tp_size, tp_rank and model, so a launch whose ranks disagree fails on
// every rank with one message listing each rank's values, instead of hanging in a collective.
#pragma once

#include <cstdint>
#include <string>

#include "dist/collectives.h"

namespace metaload {

struct TpIdentity {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  // What the rank runs: class, config fingerprint and dtype; equal ranks run the same model.
  std::string model;
};

// All-gathers every rank's identity and checks that all ranks have tp_size == the group's size,
// tp_rank == their rank in the group, and the same model. DistributedError listing every rank's
// values otherwise (the same message on every rank), or when the all-gather fails or times out.
void check_tp_agreement(Collectives& group, const TpIdentity& mine);

}  // namespace metaload
