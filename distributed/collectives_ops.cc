// Python side of the distributed layer: torch.classes.metaload.Collectives, the bounded
// collectives, point-to-point transfers and a load's handshake and vote on a torch.distributed
// group (python/metaload/_dist_load.py), so that the protocol and its DistributedError rules live
// here once, for C++ and Python callers alike.
#include <cmath>
#include <tuple>

#include <fmt/format.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <nlohmann/json.hpp>

#include "base/torch_library.h"
#include "distributed/collectives.h"
#include "distributed/handshake.h"

namespace metaload {
namespace {

struct CollectivesHolder : torch::CustomClassHolder {
  explicit CollectivesHolder(std::unique_ptr<Collectives> c) : c(std::move(c)) {}
  std::unique_ptr<Collectives> c;
};
using Holder = c10::intrusive_ptr<CollectivesHolder>;

Holder make(c10::IValue group, double timeout_s) {
  if (!(timeout_s > 0) || timeout_s > 1e9)
    throw DistributedError(
        fmt::format("timeout must be a positive number of seconds, got {}", timeout_s));
  const auto ms = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_s * 1000)));
  return c10::make_intrusive<CollectivesHolder>(
      std::make_unique<Collectives>(process_group_from_ivalue(group), ms));
}

// A vote on a load (handshake.h): every rank's ballot as {"failure": ..., "data": ...} JSON text,
// and the message every rank raises when not all succeeded ("" when they did).
std::tuple<std::vector<std::string>, std::string> vote(Collectives& c, const std::string& step,
                                                       const Ballot& mine) {
  const std::vector<Ballot> ballots = gather_ballots(c, step, mine);
  std::vector<std::string> out;
  for (const Ballot& b : ballots) {
    out.push_back(nlohmann::json{{"failure", b.failure},
                                 {"data", nlohmann::json::parse(b.data, nullptr, false)}}
                      .dump());
  }
  return {out, vote_failure(step, c.rank(), c.size(), ballots)};
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.class_<CollectivesHolder>("Collectives")
      .def(torch::init(&make))
      .def("rank", [](const Holder& self) -> int64_t { return self->c->rank(); })
      .def("size", [](const Holder& self) -> int64_t { return self->c->size(); })
      .def("all_gather_text",
           [](const Holder& self, std::string text) { return self->c->all_gather_text(text); })
      .def("send", [](const Holder& self, at::Tensor t,
                      int64_t dst) { self->c->send(t, static_cast<int>(dst)); })
      .def("recv", [](const Holder& self, at::Tensor t,
                      int64_t src) { self->c->recv(t, static_cast<int>(src)); })
      .def("send_text", [](const Holder& self, std::string text,
                           int64_t dst) { self->c->send_text(text, static_cast<int>(dst)); })
      .def("recv_text", [](const Holder& self,
                           int64_t src) { return self->c->recv_text(static_cast<int>(src)); })
      .def("load_handshake",
           [](const Holder& self, std::string hello) { return load_handshake(*self->c, hello); })
      .def("vote",
           [](const Holder& self, std::string step, std::string failure, std::string data) {
             return vote(*self->c, step, {failure, data});
           })
      .def("lost_contact", [](const Holder& self, std::string step, std::string why) {
        return std::string(lost_contact(*self->c, step, why).message());
      });
  m.def("load_handshake_problems(str[] hellos, int group_size) -> str[]",
        [](std::vector<std::string> hellos, int64_t group_size) {
          return load_handshake_problems(hellos, static_cast<int>(group_size));
        });
  m.def("load_default_buffer_bytes() -> int", [] { return kDefaultLoadBufferBytes; });
}

}  // namespace metaload
