/* strata.h compiles as C (C99, -pedantic -Werror) and the library links from C: one small
 * training step and two misuses through the C API, from a C program. Exits non-zero,
 * naming the failed check, on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/strata.h"

static int failures = 0;

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, strata_last_error());                                             \
      ++failures;                                                                      \
    }                                                                                  \
  } while (0)

int main(void) {
  static const char* config =
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1}},"
      " \"strata\": {\"backend\": \"cpu\", \"device_budget\": \"8MiB\", \"pinned_budget\": \"8MiB\"}}";
  strata_runtime rt;
  int64_t shape[2] = {16, 8};
  strata_group_desc desc;
  int32_t group = -1, stepped = 0;
  strata_buffer buf;
  float grad[128];
  float after[128];
  strata_stats stats;
  strata_runtime_info info;
  double scale = 0;
  int i;

  CHECK(strata_api_version() == STRATA_API_VERSION);
  CHECK(strata_runtime_create(STRATA_API_VERSION, config, &rt) == STRATA_OK);
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.name = "w";
  desc.ndim = 2;
  desc.shape = shape;
  desc.dtype = STRATA_F32;
  desc.init = STRATA_INIT_ONES;
  CHECK(strata_register_group(rt, &desc, &group) == STRATA_OK);
  CHECK(group == 0);
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK(strata_runtime_get_info(rt, &info) == STRATA_OK && info.dtype == STRATA_F32);
  CHECK(strata_loss_scale(rt, &scale) == STRATA_OK && scale == 1.0); /* no fp16 section */
  CHECK(strata_begin_micro_step(rt) == STRATA_OK);
  CHECK(strata_acquire(rt, group, &buf) == STRATA_OK);
  CHECK(buf.numel == 128 && buf.device_type == STRATA_DEVICE_CPU && buf.ready_event == NULL);
  CHECK(buf.data != NULL && ((const float*)buf.data)[127] == 1.0f);
  CHECK(strata_release(rt, group) == STRATA_OK);
  CHECK(strata_release(rt, group) == STRATA_ERR_STATE);
  CHECK(strstr(strata_last_error(), "not acquired") != NULL);
  for (i = 0; i < 128; ++i) grad[i] = 1.0f;
  CHECK(strata_grad_submit(rt, group, grad, STRATA_BF16, 128) == STRATA_ERR_DTYPE);
  CHECK(strata_grad_submit(rt, group, grad, STRATA_F32, 128) == STRATA_OK);
  CHECK(strata_step(rt, &stepped) == STRATA_OK && stepped == 1);
  CHECK(strata_read_params(rt, group, after, STRATA_F32, 128) == STRATA_OK);
  /* AdamW's first step moves every weight by lr against the gradient's sign. */
  CHECK(after[0] > 0.899f && after[0] < 0.901f);
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(strata_get_stats(rt, &stats) == STRATA_OK && stats.optimizer_steps == 1);
  CHECK(strata_runtime_destroy(rt) == STRATA_OK);
  CHECK(strata_acquire(rt, group, &buf) == STRATA_ERR_INVALID_HANDLE);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C API from C: all checks passed\n");
  return 0;
}
