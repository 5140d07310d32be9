#include "sim_gpt.hpp"

#include "strata/core/error.hpp"
#include "strata/model/gpt_driver.hpp"

namespace strata::plan {

using detail::GradView;
using detail::ParamView;

// gpt_driver.hpp's implementation M: each operation is a kernel of the group's time.
struct SimGpt::Kernels {
  Kernels(std::vector<GroupTimes> t, bool tied, bool recompute, double flops, Stream& s)
      : times(std::move(t)), tied(tied), recompute(recompute), flops(flops), compute(s) {}

  void load_tokens(const int32_t*, const int32_t*, long) {}
  void bind_resid(int, float*) {}
  void embed(const void*, int, int) { kernel(times[0].forward_s); }
  // A block's parts in order, each released after its share of the time (with one part
  // the driver releases the block after it).
  void block_forward(int l, ParamView& w, bool /*keep_output*/, int, int) {
    const GroupTimes& t = times[static_cast<size_t>(gpt_block_group(l))];
    for (int p = 0; p < w.parts(); ++p) {
      w.at(w.part_begin(p));
      kernel(t.forward_s * share(w, p));
      w.done(w.part_begin(p), w.part_end(p) - w.part_begin(p));
    }
  }
  // The final norm, then the head's forward, loss and backward and the norm's backward.
  void bind_adapters(const void*, void*) {}  // adapters' time is not modelled (LoRA runs on cpu)
  double head(const void*, const void*, long, void*, void* dlnf, float, bool) {
    STRATA_CHECK(dlnf, "the simulated GPT times training steps only");
    const size_t last = times.size() - 1;
    kernel(times[last].forward_s);
    kernel(times[tied ? 0 : last].head_s + times[last].backward_s);
    return 0;
  }
  // Parts in reverse order, each gradient handed back when written; the block's backward
  // time holds its recompute (one forward, which the driver has run) when checkpointing.
  void block_backward(int l, ParamView& w, GradView& grad, int, int) {
    const GroupTimes& t = times[static_cast<size_t>(gpt_block_group(l))];
    const double fwd = recompute ? t.forward_s : 0.0;
    for (int p = w.parts() - 1; p >= 0; --p) {
      const uint64_t b = w.part_begin(p), n = w.part_end(p) - b;
      w.at(b);
      grad.at(b);
      kernel((t.backward_s - fwd) * share(w, p));
      w.done(b, n);
      grad.wrote(b, n);
    }
  }
  void embed_backward(void*, int, int) { kernel(times[0].backward_s); }  // the scatter: no weights needed
  void last_logits(const void*, const void*, int, float*) {
    STRATA_CHECK(false, "the simulated GPT times training steps only");
  }
  void release(WeightSource& ws, int g) { ws.release_params(g); }
  void ready(WeightSource& ws, int g) { ws.grads_ready(g); }
  void release(ParamView& w) { w.release_all(); }
  void ready(GradView& g) { g.finish(); }

  static double share(const ParamView& w, int p) {
    return double(w.part_end(p) - w.part_begin(p)) / double(w.part_end(w.parts() - 1));
  }
  // The model's thread goes on once its kernel is done, as on the cpu backend.
  void kernel(double s) {
    if (s <= 0) return;
    compute.compute(s * flops, [] {});
    compute.record().wait();
    seconds += s;
  }

  std::vector<GroupTimes> times;
  bool tied, recompute;
  double flops;
  Stream& compute;
  double seconds = 0;  // of the micro-batch in flight
  double step_s = 0;   // since take_compute_s
};

SimGpt::SimGpt(const GptShape& shape, const GptOptions& opts, std::vector<GroupTimes> times, double device_flops,
               Stream& compute)
    : GptModel(shape, opts) {
  detail::check_checkpoint_options(opts);
  STRATA_CHECK(times.size() == static_cast<size_t>(shape.layers) + 2, "group_times: one per GPT group");
  k_ = std::make_unique<Kernels>(std::move(times), shape.tied(), opts.checkpointing != ActivationCheckpointing::None,
                                 device_flops, compute);
}

SimGpt::~SimGpt() = default;

double SimGpt::forward_backward(WeightSource& ws, const int32_t* inputs, const int32_t* targets, float loss_scale) {
  k_->seconds = 0;
  detail::gpt_forward_backward(*k_, ws, shape_, opts_, inputs, targets, loss_scale);
  k_->step_s += k_->seconds;
  return 0;
}

double SimGpt::forward_loss(WeightSource&, const int32_t*, const int32_t*) {
  throw Error("the simulated GPT times training steps only (forward_backward)");
}

void SimGpt::next_token_logits(WeightSource&, const int32_t*, int, float*) {
  throw Error("the simulated GPT times training steps only (forward_backward)");
}

double SimGpt::take_compute_s() {
  const double s = k_->step_s;
  k_->step_s = 0;
  return s;
}

}  // namespace strata::plan
