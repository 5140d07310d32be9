// A checkpoint's manifest.json, as read_checkpoint_info and `--resume` read it. Most
// mutations break the checksum, which is the first thing checked; so an input whose first
// byte is '#' is taken as the manifest's body, and the checksum is computed for it
// (seal_checkpoint_manifest) before it is parsed, so that the checks behind the checksum
// are reached. A manifest that parses is walked further: its data position (extra.data),
// as `--resume` restores it.
#include <cstdint>
#include <string>

#include "fuzz_common.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/model/data.hpp"
#include "strata/runtime/formats/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = strata::fuzz::bytes(data, size);
  std::string text(in);
  if (!in.empty() && in[0] == '#') {
    nlohmann::json body = strata::parse_untrusted_json(in.substr(1));
    if (body.is_discarded() || !body.is_object()) return 0;
    text = strata::seal_checkpoint_manifest(std::move(body));
  }
  strata::fuzz::only_strata_errors("fuzz_manifest", [&] {
    const strata::CheckpointInfo info = strata::parse_checkpoint_manifest("/nonexistent/step-00000001", text);
    if (info.files.size() != static_cast<size_t>(info.world_size) || info.groups.empty()) std::abort();
    if (info.extra.is_object() && info.extra.contains("data")) strata::DataPosition::from_json(info.extra["data"]);
  });
  return 0;
}
