// TieredStore (tiered_store.hpp): construction, registering and discarding tensors, the
// plan check, and what the store reports (usage, stats). The rest: tiered_store_records.hpp.
#include "strata/offload/tiered_store.hpp"

#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "tiered_store_records.hpp"

namespace strata {

TieredStore::TieredStore(Device& device, TieredStoreOptions opts) : device_(device), opts_(std::move(opts)) {
  if (opts_.device_budget == 0)
    throw ConfigError("tiered store: the device budget is 0; set strata.device_budget");
  if (opts_.pinned_budget == 0)
    throw ConfigError("tiered store: the pinned budget is 0; set strata.pinned_budget");
  device_pool_ = make_device_arena(device_, opts_.device_budget);
  PinnedOptions po = opts_.pinned;
  po.budget = opts_.pinned_budget;
  pinned_pool_ = make_pinned_pool(device_, po);
  if (!opts_.nvme.paths.empty()) {
    NvmeStoreOptions no = opts_.nvme;
    // The device decides whether data is real: on sim, NVMe transfers are simulated too.
    if (const SimCostModel* cost = device_.cost_model()) no.sim = *cost;
    nvme_ = std::make_unique<NvmeStore>(no);
    nvme_->register_buffer(pinned_pool_->base(), pinned_pool_->capacity());
  }
  to_device_ = device_.create_stream("copy:pinned->device");
  from_device_ = device_.create_stream("copy:device->pinned");
  for (int i = 0; i < 2; ++i) completers_.emplace_back([this] { completer_loop(); });
}

TieredStore::~TieredStore() {
  quiesce();
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    stopping_ = true;
  }
  cq_cv_.notify_all();
  for (auto& t : completers_) t.join();
  to_device_->synchronize();
  from_device_->synchronize();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, r] : records_)
    for (Tier t : kTiers) free_slot(*r, t);
  records_.clear();
}

TierPool* TieredStore::pool(Tier t) {
  switch (t) {
    case Tier::Device: return device_pool_.get();
    case Tier::Pinned: return pinned_pool_.get();
    case Tier::Nvme: return nullptr;
  }
  return nullptr;
}

bool TieredStore::has_tier(Tier t) const { return t != Tier::Nvme || nvme_ != nullptr; }

TieredStore::Record& TieredStore::rec(TensorId id) {
  auto it = records_.find(id);
  if (it == records_.end()) throw Error("tiered store: unknown tensor id " + std::to_string(id));
  return *it->second;
}

const TieredStore::Record& TieredStore::rec(TensorId id) const {
  auto it = records_.find(id);
  if (it == records_.end()) throw Error("tiered store: unknown tensor id " + std::to_string(id));
  return *it->second;
}

const TensorSpec& TieredStore::spec(TensorId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rec(id).spec;
}

// ---------------------------------------------------------------------------------------
// Registration

TensorId TieredStore::add(const TensorSpec& spec) {
  if (spec.bytes == 0) throw Error("tiered store: tensor '" + spec.name + "' has 0 bytes");
  if (!has_tier(spec.home))
    throw ConfigError("tiered store: tensor '" + spec.name +
                      "' lives on nvme but no NVMe tier is configured; set strata.nvme_path");
  // A tensor whose home is NVMe reaches the device through a pinned staging copy, so
  // it must fit in the pinned tier too; refuse up front rather than on first use.
  auto check_fits = [&](Tier t, const char* why) {
    uint64_t cap = t == Tier::Nvme ? nvme_->capacity() : pool(t)->capacity();
    if (spec.bytes > cap)
      throw OutOfBudget("tensor '" + spec.name + "' (" + format_bytes(spec.bytes) + ") does not fit the " +
                        to_string(t) + " tier's budget of " + format_bytes(cap) + " " + why +
                        "; raise the " + to_string(t) + " budget or split the tensor (smaller sub_group_size)");
  };
  if (spec.scratch && spec.home == Tier::Nvme)
    throw Error("tiered store: scratch tensor '" + spec.name + "' must live in device or pinned memory");
  check_fits(spec.home, "(its home)");
  if (spec.home == Tier::Nvme) check_fits(Tier::Pinned, "(NVMe data is staged through pinned memory)");

  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  auto r = std::make_unique<Record>();
  r->id = next_id_++;
  r->spec = spec;
  Record& ref = *r;
  records_.emplace(ref.id, std::move(r));
  if (!spec.scratch) {
    try {
      allocate_slot(lock, ref, spec.home);
    } catch (...) {
      records_.erase(ref.id);
      throw;
    }
    ref.at(spec.home).state = Slot::State::Valid;  // contents undefined until written
  }
  ref.last_use = ++clock_;
  return ref.id;
}

void TieredStore::remove(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  discard_locked(lock, rec(id));
  records_.erase(id);
}

void TieredStore::discard(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  discard_locked(lock, rec(id));
}

void TieredStore::discard_contents(TensorId id) {
  std::unique_lock<std::mutex> lock(mu_);
  reap_locked();
  Record& r = rec(id);
  if (r.spec.scratch) return discard_locked(lock, r);
  for (Tier t : kTiers) wait_while_filling(lock, r, t);
  for (Tier t : kTiers)
    if (r.at(t).pins > 0)
      throw Error("tiered store: cannot discard the contents of '" + r.spec.name + "': it is still acquired in the " +
                  to_string(t) + " tier; release it first");
  for (Tier t : kTiers)
    if (t != r.spec.home) free_slot(r, t);
  Slot& home = r.at(r.spec.home);
  STRATA_CHECK(home.allocated(), "tiered store: a tensor without its home reservation");
  home.state = Slot::State::Valid;
  changed_.notify_all();
}

void TieredStore::discard_locked(std::unique_lock<std::mutex>& lock, Record& r) {
  // A fill that has landed needs no wait: the memory it wrote is fenced by it.
  for (Tier t : kTiers) wait_while_filling(lock, r, t);
  for (Tier t : kTiers)
    if (r.at(t).pins > 0)
      throw Error("tiered store: cannot remove or discard '" + r.spec.name + "': it is still acquired in the " +
                  to_string(t) + " tier; release it first");
  for (Tier t : kTiers) free_slot(r, t);
  changed_.notify_all();
}

void TieredStore::check_plan(const std::vector<TensorSpec>& specs, const TieredStoreOptions& opts) {
  std::array<uint64_t, kTierCount> home{};
  uint64_t largest_staged = 0;
  const std::string* largest_name = nullptr;
  for (const auto& s : specs) {
    if (s.scratch) continue;  // takes room only while filled; checked when it is
    home[idx(s.home)] += tier_allocation_bytes(s.bytes);
    if (s.home == Tier::Nvme && s.bytes > largest_staged) {
      largest_staged = s.bytes;
      largest_name = &s.name;
    }
  }
  const std::array<uint64_t, kTierCount> budget{opts.device_budget, opts.pinned_budget,
                                                opts.nvme.paths.empty() ? 0 : opts.nvme.capacity};
  std::ostringstream os;
  for (Tier t : kTiers) {
    if (home[idx(t)] > budget[idx(t)]) {
      os << "the " << to_string(t) << " tier must hold " << format_bytes(home[idx(t)])
         << " of tensors that live there, but its budget is " << format_bytes(budget[idx(t)]);
      if (t == Tier::Nvme && opts.nvme.paths.empty())
        os << " (no nvme_path is set)";
      else
        os << " (strata." << (t == Tier::Device ? "device" : t == Tier::Pinned ? "pinned" : "nvme") << "_budget)";
      os << "; ";
    }
  }
  if (largest_name && largest_staged > opts.pinned_budget)
    os << "tensor '" << *largest_name << "' (" << format_bytes(largest_staged)
       << ") lives on NVMe and is staged through pinned memory, but the pinned budget is only "
       << format_bytes(opts.pinned_budget) << "; ";
  std::string msg = os.str();
  if (!msg.empty())
    throw OutOfBudget("the plan does not fit: " + msg.substr(0, msg.size() - 2) +
                      ". Raise the budgets, offload to a lower tier, or add NVMe capacity.");
}

// ---------------------------------------------------------------------------------------
// Accounting

void TieredStore::set_schedule(std::vector<TensorId> order) {
  std::lock_guard<std::mutex> lock(mu_);
  schedule_ = std::move(order);
  schedule_pos_.clear();
  for (size_t i = 0; i < schedule_.size(); ++i) schedule_pos_[schedule_[i]].push_back(i);
  position_ = 0;
}

void TieredStore::set_position(size_t pos) {
  std::lock_guard<std::mutex> lock(mu_);
  position_ = schedule_.empty() ? 0 : pos % schedule_.size();
}

bool TieredStore::is_valid(TensorId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = rec(id).at(tier);
  return s.state == Slot::State::Valid ||
         (s.state == Slot::State::Filling && s.filling->ev.ready() && !s.filling->ev.result());
}

TierUsage TieredStore::usage(Tier t) const {
  if (t != Tier::Nvme) return (t == Tier::Device ? device_pool_ : pinned_pool_)->usage();
  TierUsage u;
  if (!nvme_) return u;
  u.budget = nvme_->capacity();
  u.used = nvme_->used();
  u.peak = nvme_->peak();
  for (const auto& [id, r] : records_)
    if (r->at(Tier::Nvme).extent.valid()) u.by_owner[r->spec.owner] += r->at(Tier::Nvme).extent.bytes;
  return u;
}

StoreStats TieredStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreStats s = stats_;
  for (Tier t : kTiers) s.tiers[idx(t)] = usage(t);
  return s;
}

}  // namespace strata
