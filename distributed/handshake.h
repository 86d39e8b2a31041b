// The tensor-parallel handshake: before a rank loads or runs anything, every rank of the group
// tells every other its tp_size, tp_rank and model, so a launch whose ranks disagree fails on
// every rank with one message listing each rank's values, instead of hanging in a collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/collectives.h"

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

// One rank's part in a vote: how its step went ("" when it succeeded, else why not) and what it
// tells the others besides (JSON text, e.g. the bytes it read; "null" for nothing).
struct Ballot {
  std::string failure;
  std::string data = "null";
};

// Every rank's ballot, in rank order (a bounded all-gather). A rank that died or went silent
// fails it within the group's timeout: DistributedError naming `step` and this rank, never a hang.
std::vector<Ballot> gather_ballots(Collectives& group, const std::string& step, const Ballot& mine);

// The message every rank raises when not every ballot is a success: `step`, this rank, and each
// failed rank with its reason; "" when every rank succeeded.
std::string vote_failure(const std::string& step, int rank, int size,
                         const std::vector<Ballot>& ballots);

// A vote on a step every rank must take together or not at all (a tensor-parallel dispatch):
// each rank says how its part went (`my_failure`, "" when it succeeded). Returns on every rank
// only when every rank succeeded; otherwise every rank raises the same DistributedError
// (vote_failure), and a rank that died or went silent fails the vote within the group's timeout
// (gather_ballots), never a hang.
void agree_on_outcome(Collectives& group, const std::string& step, const std::string& my_failure);

// ---- A load across the ranks of a group (python/metaload/_dist_load.py binds these) ----------

// The version of a load's messages: ranks whose metaload differs here refuse to load together.
constexpr int kLoadProtocol = 1;
// A broadcast load's transfer buffer when the caller gives 0.
constexpr int64_t kDefaultLoadBufferBytes = int64_t{64} << 20;

// Every way the ranks' hellos disagree, one line each ("tp_size differs (rank 0: 2, rank 1: 3)");
// none when they agree. A hello is a JSON object: protocol, tp_rank, tp_size, source_rank (null:
// every rank reads its own slice), buffer_bytes (0: the default), and dequantize and tp_plan
// (any JSON, equal on every rank).
std::vector<std::string> load_handshake_problems(const std::vector<std::string>& hellos,
                                                 int group_size);

// All-gathers this rank's hello (stamped with kLoadProtocol) and returns every rank's, in rank
// order, when they agree. DistributedError otherwise: the same on every rank, listing each
// problem; or naming this rank when the all-gather fails (lost_contact).
std::vector<std::string> load_handshake(Collectives& group, const std::string& hello);

// The DistributedError of a load whose `step` lost contact with a rank (`why`: the collective's
// error): nothing was loaded and the group must be made again.
DistributedError lost_contact(const Collectives& group, const std::string& step,
                              const std::string& why);

}  // namespace metaload
