#include "activation_store.hpp"

#include <algorithm>

#include "strata/core/error.hpp"
#include "strata/runtime/engine/shard_layout.hpp"

namespace strata {

TieredActivationStore::TieredActivationStore(TieredStore& store, Device& device, std::vector<TensorId> ids, uint64_t bytes,
                                     Tier home, std::function<void(double, const std::string&)> waited)
    : store_(store),
      device_(device),
      ids_(std::move(ids)),
      bytes_(bytes),
      home_(home),
      waited_(std::move(waited)),
      held_(ids_.size(), Held::None),
      leaving_(ids_.size()) {}

void TieredActivationStore::check_index(int i, const char* what) const {
  if (i < 0 || i >= count())
    throw Error(std::string("checkpoint store: ") + what + " of checkpoint " + std::to_string(i) + "; there are " +
                std::to_string(count()));
}

void TieredActivationStore::wait(const Event& ready, int i, const char* what) {
  const double t0 = device_.now();
  ready.wait();
  if (device_.now() > t0) waited_(t0, std::string(what) + " checkpoint." + std::to_string(i));
}

void TieredActivationStore::let_go(int i) {
  if (held_[i] == Held::None) return;
  store_.release(ids_[i], Tier::Device, held_[i] == Held::Writing ? Access::Write : Access::Read);
  store_.discard_contents(ids_[i]);
  held_[i] = Held::None;
}

void TieredActivationStore::reset() {
  for (int i = 0; i < count(); ++i) let_go(i);
}

void* TieredActivationStore::begin_write(int i) {
  check_index(i, "begin_write");
  let_go(i);
  // Block i - 1 is about to read checkpoint i - 1 and write this one; i - 2 may still be on
  // its way home (its move started when block i - 2 ended, with no compute since), and
  // i - 3 must have left: kLiveCheckpoints on the device.
  if (i >= kLiveCheckpoints) {
    wait(leaving_[i - kLiveCheckpoints], i - kLiveCheckpoints, "move home of");
    leaving_[i - kLiveCheckpoints] = Event();
  }
  const Acquired a = store_.acquire_for_overwrite(ids_[i], Tier::Device);
  held_[i] = Held::Writing;
  wait(a.ready, i, "write");
  return a.data;
}

void TieredActivationStore::end_forward(int i, bool keep) {
  check_index(i, "end_forward");
  if (held_[i] != Held::Writing)
    throw Error("checkpoint store: end_forward(" + std::to_string(i) + ") without begin_write");
  store_.release(ids_[i], Tier::Device, Access::Write);
  held_[i] = Held::None;
  if (!keep) {
    store_.discard_contents(ids_[i]);
    return;
  }
  if (home_ == Tier::Device || i == count() - 2) return;
  leaving_[i] = store_.drop(ids_[i], Tier::Device);
  if (home_ == Tier::Nvme) leaving_[i] = when_all({leaving_[i], store_.drop(ids_[i], Tier::Pinned)});
}

const void* TieredActivationStore::read(int i) {
  check_index(i, "read");
  let_go(i);
  const Acquired a = store_.acquire(ids_[i], Tier::Device);
  held_[i] = Held::Reading;
  // The next two backward reads, on their way while this block computes (kLiveCheckpoints:
  // this one and those two). A prefetch is advice: with no room now, read() fetches on demand.
  if (home_ != Tier::Device)
    for (int j = i - 1; j >= std::max(0, i - (kLiveCheckpoints - 1)); --j) {
      try {
        store_.fetch(ids_[j], Tier::Device);
      } catch (const OutOfBudget&) {
        break;
      }
    }
  wait(a.ready, i, "read");
  return a.data;
}

void TieredActivationStore::finish(int i) {
  check_index(i, "finish");
  if (held_[i] != Held::Reading) throw Error("checkpoint store: finish(" + std::to_string(i) + ") without read");
  let_go(i);
}

}  // namespace strata
