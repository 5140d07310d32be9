"""The Python module over the C API: DLPack views (torch and numpy), errors, lifetimes,
threads, checkpoints. Run by CTest with PYTHONPATH=<build>/python."""
import json
import os
import tempfile
import threading
import unittest

import numpy as np
import torch

import strata


def config(**strata_section):
    s = {"backend": "cpu", "device_budget": "8MiB", "pinned_budget": "8MiB"}
    s.update(strata_section)
    return {"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "strata": s}


def config16(section, **keys):
    """config() training in 16 bits: section is "bf16" or "fp16" (keys: its other keys)."""
    c = config()
    c[section] = {"enabled": True, **keys}
    return c


class Module(unittest.TestCase):
    def test_version(self):
        self.assertEqual(strata.api_version(), strata.API_VERSION)
        self.assertEqual(strata.api_version() >> 16, 1)
        self.assertIn("api 1.2", strata.version())

    def test_from_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            with open(path, "w") as f:
                json.dump(config(), f)
            with strata.Runtime.from_file(path) as rt:
                self.assertEqual(rt.info()["world_size"], 1)
                self.assertEqual(rt.info()["device"], "cpu")
        with self.assertRaises(strata.StrataError) as e:
            strata.Runtime.from_file("/nonexistent/run.json")
        self.assertEqual(e.exception.status, "STRATA_ERR_CONFIG")
        self.assertIn("/nonexistent/run.json", str(e.exception))

    def test_acquired_buffers_are_zero_copy_views(self):
        with strata.Runtime.from_config(config()) as rt:
            data = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
            g = rt.register_group("w", [2, 3, 4], data=data)
            rt.begin_micro_step()
            b = rt.acquire(g)
            self.assertEqual(b.__dlpack_device__(), (1, 0))  # kDLCPU
            self.assertEqual(b.shape, [2, 3, 4])
            self.assertEqual(b.device, "cpu")
            t = torch.from_dlpack(b)
            a = np.from_dlpack(b)
            self.assertEqual(t.data_ptr(), b.ptr, "torch copied the buffer")
            self.assertEqual(a.__array_interface__["data"][0], b.ptr, "numpy copied the buffer")
            self.assertTrue(torch.equal(t, data))
            np.testing.assert_array_equal(a, data.numpy())
            rt.release(g)

    def test_views_keep_the_runtime_alive(self):
        rt = strata.Runtime.from_config(config())
        g = rt.register_group("w", [1000], init="constant", value=0.5)
        rt.begin_micro_step()
        t = torch.from_dlpack(rt.acquire(g))
        rt.close()
        with self.assertRaises(strata.StrataError) as e:
            rt.begin_micro_step()
        self.assertEqual(e.exception.status, "STRATA_ERR_INVALID_HANDLE")
        # The C runtime lives on while the tensor does: its memory is still there.
        self.assertEqual(float(t.sum()), 500.0)
        del t  # now it goes (nothing to observe but that this does not crash)

    def test_gradient_buffer_and_submit_agree(self):
        results = []
        for zero_copy in (False, True):
            with strata.Runtime.from_config(config()) as rt:
                g = rt.register_group("w", [64], data=torch.linspace(-1, 1, 64))
                for step in range(3):
                    rt.begin_micro_step()
                    w = torch.from_dlpack(rt.acquire(g)).clone()
                    rt.release(g)
                    grad = (w - 0.25) * (step + 1)
                    if zero_copy:
                        gb = rt.grad_buffer(g)
                        self.assertTrue(gb.writable)
                        torch.from_dlpack(gb).copy_(grad)
                        rt.grad_ready(g)
                    else:
                        rt.submit_grad(g, grad)
                    self.assertTrue(rt.step())
                results.append(rt.read_params(g))
        np.testing.assert_array_equal(results[0], results[1])
        self.assertFalse(np.allclose(results[0], np.linspace(-1, 1, 64)), "nothing trained")

    def test_errors_name_the_status_and_the_fix(self):
        with strata.Runtime.from_config(config()) as rt:
            g = rt.register_group("w", [16], init="zeros")
            with self.assertRaises(strata.StrataError) as e:
                rt.acquire(g)
            self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
            self.assertIn("strata_begin_micro_step", str(e.exception))
            rt.begin_micro_step()
            with self.assertRaises(strata.StrataError) as e:
                rt.acquire(5)
            self.assertEqual(e.exception.status, "STRATA_ERR_UNKNOWN_GROUP")
            with self.assertRaises(strata.StrataError) as e:
                rt.release(g)
            self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, torch.ones(16, dtype=torch.float16))
            self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, np.ones(16))  # float64
            self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, torch.ones(32)[::2])
            self.assertIn("not contiguous", str(e.exception))
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, [1.0] * 16)
            self.assertIn("__dlpack__", str(e.exception))
            with self.assertRaises(strata.StrataError) as e:
                rt.register_group("late", [4])
            self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
        with self.assertRaises(strata.StrataError) as e:
            strata.Runtime.from_config({"zero_optimisation": {}})
        self.assertEqual(e.exception.status, "STRATA_ERR_CONFIG")
        self.assertIn("did you mean", str(e.exception))
        with self.assertRaises(strata.StrataError) as e:
            strata.Runtime.from_config(config()).register_group("h", [4], data=torch.ones(4, dtype=torch.bfloat16))
        self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")

    def test_groups_schedule_and_info(self):
        # Parameters in pinned memory: on one rank with them on the device there is nothing to
        # gather (each group is read in place), so nothing to prefetch either.
        cfg = config()
        cfg["zero_optimization"] = {"stage": 3, "offload_param": {"device": "cpu"}}
        with strata.Runtime.from_config(cfg) as rt:
            a = rt.register_group("a", [3, 5], init="normal", std=0.1)
            b = rt.register_group("b", [7], init="ones")
            self.assertEqual((rt.find_group("b"), rt.group_shape(a)), (b, [3, 5]))
            with self.assertRaises(strata.StrataError) as e:
                rt.find_group("c")
            self.assertEqual(e.exception.status, "STRATA_ERR_UNKNOWN_GROUP")
            with self.assertRaises(strata.StrataError) as e:
                rt.register_group("d", [2], init="uniform")
            self.assertIn("not one of normal", str(e.exception))
            self.assertFalse(rt.info()["started"])
            rt.start()
            self.assertTrue(rt.info()["started"])
            rt.set_schedule([a, b, b, a])
            for _ in range(2):
                rt.begin_micro_step()
                for g in (a, b, b, a):
                    rt.acquire(g)
                    rt.release(g)
                rt.submit_grad(a, torch.zeros(15))
                rt.submit_grad(b, torch.zeros(7))
                rt.step()
            s = rt.stats()
            self.assertEqual(s["trace_departures"], 0)
            self.assertGreater(s["prefetched"], 0)
            # Zero gradients and no weight decay: AdamW leaves the weights as they were.
            np.testing.assert_array_equal(rt.read_params(b), np.ones(7, dtype=np.float32))

    def test_threads_share_a_runtime(self):
        with strata.Runtime.from_config(config()) as rt:
            ids = [rt.register_group(f"g{i}", [256], data=torch.full((256,), float(i))) for i in range(4)]
            errors = []

            def work(g):
                try:
                    w = torch.from_dlpack(rt.acquire(g)).clone()
                    rt.release(g)
                    rt.submit_grad(g, w)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            for _ in range(3):
                rt.begin_micro_step()
                ts = [threading.Thread(target=work, args=(g,)) for g in ids]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                self.assertEqual(errors, [])
                rt.step()
            self.assertEqual(rt.stats()["optimizer_steps"], 3)

    def test_checkpoints_and_stats(self):
        with tempfile.TemporaryDirectory() as nvme, tempfile.TemporaryDirectory() as root:
            cfg = config()
            cfg["zero_optimization"] = {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
                                        "offload_param": {"device": "nvme", "nvme_path": nvme}}
            with strata.Runtime.from_config(cfg) as rt:
                g = rt.register_group("w", [4096], data=torch.linspace(0, 1, 4096))
                rt.begin_micro_step()
                rt.submit_grad(g, torch.ones(4096))
                rt.step()
                d = rt.save_checkpoint(root, json.dumps({"epoch": 1}))
                saved = rt.read_params(g)
                s = rt.stats()
                self.assertGreater(s["tiers"]["nvme"]["used"], 0)
                self.assertGreater(s["bytes_moved"]["pinned->nvme"], 0)
                self.assertIn("trace_departures", s)
                self.assertIn("exposed_wait_s", s)
            self.assertEqual(strata.latest_checkpoint(root), d)
            self.assertIsNone(strata.latest_checkpoint(nvme))
            with strata.Runtime.from_config(cfg) as rt:
                g = rt.register_group("w", [4096], init="zeros")
                self.assertEqual(json.loads(rt.load_checkpoint(root)), {"epoch": 1})
                np.testing.assert_array_equal(rt.read_params(g), saved)

    def test_text_with_a_nul_is_refused_not_cut_short(self):
        # The C API takes NUL-terminated strings: 'a\0b' used to register a group named 'a'.
        with tempfile.TemporaryDirectory() as root:
            with strata.Runtime.from_config(config()) as rt:
                for name in ("a\0b", "\0", "block.0\0", "\0tail", "блок\0.1"):
                    with self.assertRaises(ValueError) as e:
                        rt.register_group(name, [4], init="zeros")
                    self.assertIn("holds a NUL character", str(e.exception))
                    self.assertIn("remove the NUL", str(e.exception))
                    with self.assertRaises(ValueError):
                        rt.find_group(name)
                self.assertEqual(rt.info()["num_groups"], 0, "a name with a NUL registered something")
                g = rt.register_group("a", [4], init="zeros")
                rt.begin_micro_step()
                rt.submit_grad(g, torch.zeros(4))
                rt.step()
                for bad in (root + "\0x", "\0"):
                    with self.assertRaises(ValueError):
                        rt.save_checkpoint(bad)
                    with self.assertRaises(ValueError):
                        rt.load_checkpoint(bad)
                    with self.assertRaises(ValueError):
                        strata.latest_checkpoint(bad)
                with self.assertRaises(ValueError):
                    rt.save_checkpoint(root, '{"epoch": 1}\0{"epoch": 2}')
                self.assertIsNone(strata.latest_checkpoint(root), "a refused save left a checkpoint")
            with self.assertRaises(ValueError):
                strata.Runtime.from_config(json.dumps(config()) + "\0 trailing")
            with self.assertRaises(ValueError):
                strata.Runtime.from_file(os.path.join(root, "run.json\0.txt"))

    def test_writes_into_acquired_parameters_are_found_at_release(self):
        # strata.checksums: the release names the group, persistent (kept gathered) or not.
        cfg = config(checksums=True)
        cfg["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 100}
        with strata.Runtime.from_config(cfg) as rt:
            small = rt.register_group("small", [64], init="ones")
            large = rt.register_group("large", [4096], init="ones")
            rt.begin_micro_step()
            for g, name in ((small, "small"), (large, "large")):
                torch.from_dlpack(rt.acquire(g))[3] += 1.0
                with self.assertRaises(strata.StrataError) as e:
                    rt.release(g)
                self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
                self.assertIn(f"group '{name}' were written while acquired", str(e.exception))
                rt.acquire(g)  # released all the same: a clean acquire and release follow
                rt.release(g)


class SixteenBits(unittest.TestCase):
    """A bf16 or fp16 runtime: bfloat16/float16 DLPack views, 16-bit gradients, the loss scale."""

    def test_bf16_buffers_are_bfloat16_views(self):
        with strata.Runtime.from_config(config16("bf16")) as rt:
            self.assertEqual(rt.dtype, "bfloat16")
            self.assertEqual(rt.info()["dtype"], "bfloat16")
            self.assertEqual(rt.loss_scale(), 1.0)
            data = torch.linspace(-1, 1, 24).reshape(2, 3, 4).to(torch.bfloat16)
            g = rt.register_group("w", [2, 3, 4], data=data)
            c = rt.register_group("c", [5], init="constant", value=0.1)  # rounded to bf16
            rt.begin_micro_step()
            b = rt.acquire(g)
            self.assertEqual(b.dtype, "bfloat16")
            t = torch.from_dlpack(b)
            self.assertEqual(t.dtype, torch.bfloat16)
            self.assertEqual(t.data_ptr(), b.ptr, "torch copied the buffer")
            self.assertTrue(torch.equal(t, data))
            self.assertTrue(torch.equal(torch.from_dlpack(rt.acquire(c)), torch.full((5,), 0.1).to(torch.bfloat16)))
            rt.release(c)
            rt.release(g)
            gb = rt.grad_buffer(g)
            self.assertEqual(gb.dtype, "bfloat16")
            torch.from_dlpack(gb).zero_()
            rt.grad_ready(g)
            rt.submit_grad(c, torch.zeros(5, dtype=torch.bfloat16))
            self.assertTrue(rt.step())
            # Zero gradients: weight decay alone moves the fp32 master weights by a relative
            # 1e-4, less than half a bf16 unit, so the working copy is the data again.
            np.testing.assert_array_equal(rt.read_params(g), data.float().numpy())
            self.assertEqual(rt.read_params(g).dtype, np.float32)

    def test_bf16_training_follows_torch_adamw_on_fp32_master_weights(self):
        # Strata's bf16 is DeepSpeed's: AdamW on fp32 master weights, the model reads them
        # rounded to bf16 and hands in bf16 gradients. torch.optim.AdamW on an fp32 copy,
        # fed the same rounded gradients, is the reference. Both optimizers are fp32, but
        # not the same code: where a master weight lies within their difference of a bf16
        # rounding boundary the working copies are neighbours, hence the allowance (none
        # differed when this was written: 10 steps, torch 1.13).
        torch.manual_seed(0)
        n = 512
        init = torch.randn(n).to(torch.bfloat16)
        target = torch.randn(n)
        cfg = config16("bf16")
        cfg["optimizer"]["params"].update({"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01})
        master = torch.nn.Parameter(init.float())
        opt = torch.optim.AdamW([master], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        with strata.Runtime.from_config(cfg) as rt:
            g = rt.register_group("w", [n], data=init)
            for step in range(10):
                rt.begin_micro_step()
                w = torch.from_dlpack(rt.acquire(g)).clone()
                rt.release(g)
                ref = master.detach().to(torch.bfloat16)
                differ = int((w != ref).sum())
                self.assertLessEqual(differ, n // 100, f"step {step}: {differ} of {n} working values differ")
                torch.testing.assert_close(w, ref, rtol=2 ** -7, atol=0)  # at most one bf16 unit
                rt.submit_grad(g, ((w.float() - target) * 2).to(torch.bfloat16))
                self.assertTrue(rt.step())
                master.grad = ((ref.float() - target) * 2).to(torch.bfloat16).float()
                opt.step()
            self.assertEqual(rt.stats()["optimizer_steps"], 10)

    def test_bf16_gradients_must_be_bf16(self):
        with strata.Runtime.from_config(config16("bf16")) as rt:
            g = rt.register_group("w", [16], init="ones")
            rt.begin_micro_step()
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, torch.ones(16))  # float32
            self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")
            self.assertIn("group 'w' is BF16", str(e.exception))
            self.assertIn("but the buffer is F32", str(e.exception))
            self.assertIn("does not convert gradients", str(e.exception))
            with self.assertRaises(strata.StrataError) as e:
                rt.submit_grad(g, torch.ones(16, dtype=torch.float16))
            self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")
            rt.submit_grad(g, torch.ones(16, dtype=torch.bfloat16))  # nothing was handed in before
            self.assertTrue(rt.step())
        with strata.Runtime.from_config(config16("bf16")) as rt:
            with self.assertRaises(strata.StrataError) as e:
                rt.register_group("w", [4], data=torch.ones(4))  # float32 data in a bf16 runtime
            self.assertEqual(e.exception.status, "STRATA_ERR_DTYPE")
            self.assertIn("does not match the runtime's BF16", str(e.exception))

    def test_fp16_loss_scale_and_overflow_skip(self):
        with strata.Runtime.from_config(config16("fp16", hysteresis=1)) as rt:
            self.assertEqual(rt.dtype, "float16")
            g = rt.register_group("w", [32], init="constant", value=0.5)
            self.assertEqual(rt.loss_scale(), 65536.0)  # DeepSpeed's first dynamic scale
            rt.begin_micro_step()
            w = torch.from_dlpack(rt.acquire(g))
            self.assertEqual(w.dtype, torch.float16)
            self.assertTrue(torch.equal(w, torch.full((32,), 0.5, dtype=torch.float16)))
            rt.release(g)
            grad = torch.full((32,), 0.25 * rt.loss_scale(), dtype=torch.float16)  # 16384: fits
            grad[5] = float("inf")  # what an overflowing scaled gradient becomes
            rt.submit_grad(g, grad)
            self.assertFalse(rt.step())
            self.assertEqual(rt.loss_scale(), 32768.0)
            s = rt.stats()
            self.assertEqual((s["skipped_steps"], s["loss_scale"], s["optimizer_steps"]), (1, 32768.0, 0))
            np.testing.assert_array_equal(rt.read_params(g), np.full(32, 0.5, dtype=np.float32))
            # At the new scale the step is taken with the scale divided out (the norm is of
            # the unscaled gradient); AdamW's first step moves each weight by lr.
            rt.begin_micro_step()
            rt.submit_grad(g, torch.full((32,), 0.25 * rt.loss_scale(), dtype=torch.float16))
            self.assertTrue(rt.step())
            s = rt.stats()
            self.assertAlmostEqual(s["last_grad_norm"], 0.25 * 32 ** 0.5, places=6)
            self.assertEqual(s["skipped_steps"], 1)
            np.testing.assert_allclose(rt.read_params(g), np.full(32, 0.49, dtype=np.float32), atol=2 ** -11)



class Frozen(unittest.TestCase):
    """register_group(..., frozen=True): a frozen base beside a trained adapter (a LoRA run)."""

    BASE, ADAPTER = 64 * 1024, 4 * 1024  # elements: no padding, whole 4 KiB units in bf16

    def run_pair(self, offload, nvme_dir=None):
        cfg = config16("bf16")
        off = {"device": offload}
        if nvme_dir:
            off["nvme_path"] = nvme_dir
        cfg["zero_optimization"] = {"stage": 3, "offload_param": dict(off), "offload_optimizer": dict(off),
                                    "stage3_param_persistence_threshold": 0}
        torch.manual_seed(0)
        with strata.Runtime.from_config(cfg) as rt:
            base = rt.register_group("base", [64, 1024], data=torch.randn(self.BASE).to(torch.bfloat16).reshape(64, 1024),
                                     frozen=True)
            adapter = rt.register_group("adapter", [4, 1024], init="normal", std=0.02)
            rt.start()
            base0, adapter0 = rt.read_params(base), rt.read_params(adapter)
            for _ in range(3):
                rt.begin_micro_step()
                for g in (base, adapter, adapter, base):
                    rt.acquire(g)
                    rt.release(g)
                rt.submit_grad(adapter, torch.full((self.ADAPTER,), 0.5).to(torch.bfloat16))  # none for the base
                self.assertTrue(rt.step())
            with self.assertRaises(strata.StrataError) as e:
                rt.begin_micro_step()
                rt.grad_buffer(base)
            self.assertEqual(e.exception.status, "STRATA_ERR_INVALID_ARGUMENT")
            self.assertIn("'base' is frozen", str(e.exception))
            # The frozen group bit for bit as it was; the adapter trained.
            self.assertTrue(np.array_equal(rt.read_params(base).view(np.uint32), base0.view(np.uint32)))
            self.assertFalse(np.array_equal(rt.read_params(adapter), adapter0))
            return rt.stats()

    def expected_home_bytes(self):
        # bf16 parameter shards (2 B) for both; the adapter adds its bf16 gradient (2 B, no
        # accumulation) and fp32 master weights and two moments (12 B).
        return 2 * self.BASE + (2 + 2 + 12) * self.ADAPTER

    def test_pinned_holds_the_frozen_group_s_parameters_alone(self):
        s = self.run_pair("cpu")
        self.assertEqual(s["optimizer_steps"], 3)
        self.assertEqual(s["tiers"]["pinned"]["used"], self.expected_home_bytes())

    def test_nvme_holds_the_frozen_group_s_parameters_alone(self):
        with tempfile.TemporaryDirectory() as d:
            s = self.run_pair("nvme", d)
        self.assertEqual(s["tiers"]["nvme"]["used"], self.expected_home_bytes())


if __name__ == "__main__":
    unittest.main()
