#include "distributed/handshake.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/text.h"

namespace metaload {

void check_tp_agreement(Collectives& group, const TpIdentity& mine) {
  const nlohmann::json me = {
      {"tp_size", mine.tp_size}, {"tp_rank", mine.tp_rank}, {"model", mine.model}};
  std::vector<std::string> texts;
  try {
    texts = group.all_gather_text(me.dump());
  } catch (const DistributedError& e) {
    throw DistributedError(fmt::format("tensor-parallel handshake (tp_size {}, tp_rank {}): {}",
                                       mine.tp_size, mine.tp_rank, e.message()));
  }
  std::vector<TpIdentity> all;
  for (size_t r = 0; r < texts.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(texts[r], nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("tp_size") || !j.contains("tp_rank") || !j.contains("model"))
      throw DistributedError(fmt::format(
          "tensor-parallel handshake: rank {} sent {}, not a metaload handshake (is every rank "
          "running metaload's TransformersModel with the same version?)",
          r, quote_text(texts[r])));
    all.push_back(
        {j["tp_size"].get<int64_t>(), j["tp_rank"].get<int64_t>(), j["model"].get<std::string>()});
  }
  std::vector<std::string> problems;
  std::string sizes, ranks, models;
  bool sizes_differ = false, ranks_wrong = false, models_differ = false;
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string sep = r ? ", " : "";
    sizes += fmt::format("{}rank {}: {}", sep, r, all[r].tp_size);
    ranks += fmt::format("{}rank {}: {}", sep, r, all[r].tp_rank);
    models += fmt::format("{}rank {}: {}", sep, r, all[r].model);
    sizes_differ |= all[r].tp_size != group.size();
    ranks_wrong |= all[r].tp_rank != static_cast<int64_t>(r);
    models_differ |= all[r].model != all[0].model;
  }
  if (sizes_differ)
    problems.push_back(fmt::format("tp_size must equal the group's size {} on every rank ({})",
                                   group.size(), sizes));
  if (ranks_wrong && !sizes_differ)
    problems.push_back(
        fmt::format("tp_rank must equal each process's rank in the group ({})", ranks));
  if (models_differ) problems.push_back(fmt::format("the ranks run different models ({})", models));
  if (problems.empty()) return;
  std::string message = fmt::format(
      "tensor-parallel handshake on rank {} of {}: the ranks disagree", group.rank(), group.size());
  for (const std::string& p : problems) message += "; " + p;
  throw DistributedError(message);
}

std::vector<Ballot> gather_ballots(Collectives& group, const std::string& step,
                                   const Ballot& mine) {
  const nlohmann::json data = nlohmann::json::parse(mine.data, nullptr, false);
  const std::string text = nlohmann::json{{"failure", mine.failure}, {"data", data}}.dump();
  std::vector<std::string> texts;
  try {
    texts = group.all_gather_text(text);
  } catch (const DistributedError& e) {
    throw DistributedError(
        fmt::format("{} on rank {} of {}: the ranks could not agree that every "
                    "rank succeeded, so none goes ahead: {}",
                    step, group.rank(), group.size(), e.message()));
  }
  std::vector<Ballot> out;
  for (size_t r = 0; r < texts.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(texts[r], nullptr, false);
    if (!j.is_object() || !j.contains("failure") || !j["failure"].is_string()) {
      // Never read as a success: a rank that sent something else failed.
      out.push_back({"sent " + quote_text(texts[r]), "null"});
      continue;
    }
    out.push_back({j["failure"].get<std::string>(), j.value("data", nlohmann::json()).dump()});
  }
  return out;
}

std::string vote_failure(const std::string& step, int rank, int size,
                         const std::vector<Ballot>& ballots) {
  std::string failures;
  for (size_t r = 0; r < ballots.size(); ++r) {
    if (ballots[r].failure.empty()) continue;
    failures += fmt::format("{}rank {}: {}", failures.empty() ? "" : "; ", r, ballots[r].failure);
  }
  if (failures.empty()) return "";
  return fmt::format("{} on rank {} of {}: not every rank succeeded, so no rank goes ahead ({})",
                     step, rank, size, failures);
}

void agree_on_outcome(Collectives& group, const std::string& step, const std::string& my_failure) {
  const std::string failed =
      vote_failure(step, group.rank(), group.size(), gather_ballots(group, step, {my_failure}));
  if (!failed.empty()) throw DistributedError(failed);
}

}  // namespace metaload
