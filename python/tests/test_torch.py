"""strata.torch on a user's own module: training against torch.optim.AdamW with the
states on NVMe, the grouping rule, checkpoints, gradient accumulation, evaluation, 16
bits, and misuse. Run by CTest with PYTHONPATH=<build>/python (test_torch_hf.py has the
Hugging Face models)."""
import copy
import os
import tempfile
import unittest
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

import strata
import strata.torch
from torch_harness import (DEVICE, LOSS_RTOL, LR, WEIGHT_DECAY, assert_on_nvme, batch, config, train_engine,
                           train_reference, worst_relative)

VOCAB = 48


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)    # weight [2d, d]
        self.down = nn.Linear(2 * d, d)  # weight [d, 2d]

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class UserModel(nn.Module):
    """What the grouping rule has to handle: a parameter owned by the root, a Sequential
    of blocks, a module called twice per forward, an output layer tied to the embedding
    (two modules, one tensor), and a module never called (its gradient is zero)."""

    def __init__(self, vocab=VOCAB, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=0.1)  # N(0, 1) logits through the tied output are huge
        self.gate = nn.Parameter(torch.ones(d))  # [d]
        self.stack = nn.Sequential(Mixer(d), Mixer(d))
        self.shared = Mixer(d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.embed.weight  # [vocab, d], tied
        self.unused = nn.Linear(d, d)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1]) * self.gate
        x = self.shared(self.shared(self.stack(x)))
        logits = self.out(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def loss_of(model, tokens):
    return model(tokens)


def batches(n, start=0):
    return [batch(s, VOCAB) for s in range(start, start + n)]


def user_model(seed=0):
    torch.manual_seed(seed)
    return UserModel()


class Training(unittest.TestCase):
    def test_matches_adamw_with_states_on_nvme(self):
        model = user_model()
        reference = copy.deepcopy(model)
        unused_before = model.unused.weight.detach().clone()
        with tempfile.TemporaryDirectory() as nvme:
            with strata.torch.initialize(model, config(nvme)) as engine:
                standins = list(model.parameters())
                self.assertEqual([p.numel() for p in standins], [0] * len(standins), "PyTorch still holds parameters")
                self.assertEqual(sum(p.strata_numel for p in standins), sum(p.numel() for p in reference.parameters()))
                losses = train_engine(engine, loss_of, batches(20))
                stats = engine.stats()
                weights = engine.full_state_dict()
        ref = train_reference(reference, loss_of, batches(20))
        worst = worst_relative(losses, ref)
        print(f"user model: loss {losses[0]:.4f} -> {losses[-1]:.4f}, worst relative difference {worst:.2e}")
        self.assertLess(worst, LOSS_RTOL)
        self.assertLess(losses[-1], 0.8 * losses[0], "the loss did not fall")
        assert_on_nvme(self, stats)
        self.assertEqual(stats["optimizer_steps"], 20)
        # The weights too (the same reasoning as LOSS_RTOL; absolute, as Adam's steps are
        # about lr = 3e-3 each whatever the weight's size). The never-called module: torch
        # skips a parameter without gradient, Strata hands in zeros (DeepSpeed does the
        # same), so only AdamW's decoupled weight decay moves it: w * (1 - lr*wd)^20.
        for name, ref_w in reference.state_dict().items():
            if name.startswith("unused."):
                continue
            torch.testing.assert_close(weights[name], ref_w.cpu(), rtol=0, atol=1e-5, msg=name)
        self.assertEqual(weights["out.weight"].data_ptr(), weights["embed.weight"].data_ptr(),
                         "tied names should share one tensor")
        torch.testing.assert_close(weights["unused.weight"], unused_before * (1 - LR * WEIGHT_DECAY) ** 20,
                                   rtol=1e-5, atol=0)

    def test_the_parameters_memory_is_freed(self):
        model = user_model()
        gone = weakref.ref(model.stack[0].up.weight)
        with strata.torch.initialize(model, config()) as engine:
            self.assertIsNone(gone(), "something still holds a parameter given to Strata")
            train_engine(engine, loss_of, batches(1))

    def test_gradient_accumulation(self):
        model = user_model()
        reference = copy.deepcopy(model)
        with tempfile.TemporaryDirectory() as nvme, strata.torch.initialize(model, config(nvme, 2)) as engine:
            stepped, losses = [], []
            for tokens in batches(12):
                self.assertEqual(engine.is_gradient_accumulation_boundary(), len(stepped) % 2 == 1)
                loss = engine(tokens)
                engine.backward(loss)
                stepped.append(engine.step())
                losses.append(loss.item())
            self.assertEqual(stepped, [False, True] * 6)
            self.assertEqual(engine.global_steps, 6)
            self.assertEqual(engine.stats()["optimizer_steps"], 6)
        worst = worst_relative(losses, train_reference(reference, loss_of, batches(12), accumulation=2))
        print(f"gradient accumulation 2: worst relative difference {worst:.2e}")
        self.assertLess(worst, LOSS_RTOL)

    def test_evaluation_between_steps_and_full_state_dict(self):
        model = user_model()
        with strata.torch.initialize(model, config()) as engine:
            train_engine(engine, loss_of, batches(3))
            weights = engine.full_state_dict()
            probe = batch(99, VOCAB)
            with torch.no_grad():
                evaluated = engine(probe).item()  # read_params: no micro-batch opened
            train_engine(engine, loss_of, batches(1, 3))  # training goes on after it
        fresh = UserModel()
        fresh.load_state_dict(weights)
        fresh.to(DEVICE)
        with torch.no_grad():
            self.assertEqual(evaluated, fresh(probe).item())

    def test_bf16_trains_with_bf16_views(self):
        model = user_model()
        seen = []
        model.stack[0].up.register_forward_hook(lambda m, a, out: seen.append(m.weight.dtype))
        with strata.torch.initialize(model, config(bf16={"enabled": True})) as engine:
            self.assertEqual(engine.dtype, torch.bfloat16)
            losses = train_engine(engine, loss_of, batches(20))
        self.assertEqual(seen[0], torch.bfloat16)
        self.assertLess(losses[-1], 0.8 * losses[0], "the loss did not fall in bf16")

    def test_a_failed_forward_can_be_run_again(self):
        model = user_model()
        with strata.torch.initialize(model, config()) as engine:
            with self.assertRaises(IndexError):
                engine(torch.full((2, 5), VOCAB + 7))  # a token outside the vocabulary
            self.assertEqual(model.stack[0].up.weight.numel(), 0, "a parameter stayed bound after the failure")
            losses = train_engine(engine, loss_of, batches(2))
        ref = train_reference(user_model(), loss_of, batches(2))
        self.assertLess(worst_relative(losses, ref), LOSS_RTOL)


def train_loop(model, optimizer, batches, accumulation=1, scheduler=None, clip=None):
    """The standard PyTorch loop: loss / accumulation, loss.backward(), a step every
    `accumulation` micro-batches (clip: torch's clip_grad_norm_ before it, for the
    reference; Strata clips with the config's gradient_clipping)."""
    losses = []
    for i, tokens in enumerate(batches):
        loss = loss_of(model, tokens) / accumulation
        loss.backward()
        if (i + 1) % accumulation == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def halving(step):
    return 0.5 ** step  # a schedule that moves the lr at every step


class StandardLoop(unittest.TestCase):
    """model, optimizer = strata.torch.initialize(...): loss.backward(), optimizer.step(),
    torch's schedulers, against the same loop with torch.optim.AdamW."""

    def reference(self, model, batches, accumulation=1, clip=None, trainable=None):
        model.to(DEVICE)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY)
        return train_loop(model, opt, batches, accumulation, torch.optim.lr_scheduler.LambdaLR(opt, halving), clip)

    def test_matches_adamw_with_a_scheduler_clipping_and_accumulation(self):
        for accumulation in (1, 2):
            model = user_model()
            reference = copy.deepcopy(model)
            with tempfile.TemporaryDirectory() as nvme:
                model, optimizer = strata.torch.initialize(model, config(nvme, accumulation, gradient_clipping=0.5))
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, halving)
                losses = train_loop(model, optimizer, batches(12), accumulation, scheduler)
                stats = optimizer._engine_ref.stats()
                optimizer._engine_ref.close()
            ref = self.reference(reference, batches(12), accumulation, clip=0.5)
            worst = worst_relative(losses, ref)
            print(f"standard loop, accumulation {accumulation}: worst relative difference {worst:.2e}, last "
                  f"gradient norm {stats['last_grad_norm']:.3f} (clipped to 0.5)")
            self.assertLess(worst, LOSS_RTOL)
            self.assertGreater(stats["last_grad_norm"], 0.5, "clipping never engaged: the test proves nothing")
            assert_on_nvme(self, stats)
            self.assertEqual(stats["optimizer_steps"], 12 // accumulation)

    def test_fp16_loss_scaling_without_engine_backward(self):
        # The forward's outputs carry the loss scale into loss.backward(): the standard
        # loop and engine.backward give the same run, overflow skips included.
        runs = []
        for standard in (True, False):
            with strata.torch.initialize(user_model(), config(fp16={"enabled": True})) as engine:
                model, optimizer = engine
                if standard:
                    runs.append(train_loop(model, optimizer, batches(8)))
                else:
                    runs.append(train_engine(engine, loss_of, batches(8)))
                runs[-1].append(engine.stats()["loss_scale"])
        self.assertEqual(runs[0], runs[1])
        self.assertLess(runs[0][-2], runs[0][0], "the loss did not fall in fp16")

    def test_frozen_parameters_get_no_gradient_and_stay(self):
        def model_with_frozen():
            m = user_model()
            m.stack.requires_grad_(False)   # whole groups
            m.shared.up.bias.requires_grad_(False)  # part of one
            return m

        model = model_with_frozen()
        reference = copy.deepcopy(model)
        frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        with tempfile.TemporaryDirectory() as nvme:
            engine = strata.torch.initialize(model, config(nvme))
            names = [(g.name, g.frozen) for g in engine.groups]
            model, optimizer = engine
            losses = train_loop(model, optimizer, batches(12),
                                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, halving))
            weights = engine.full_state_dict()
            engine.close()
        self.assertIn(("stack.0", True), names)
        self.assertIn(("shared.up", False), names)
        self.assertIn(("shared.up (frozen)", True), names)
        ref = self.reference(reference, batches(12))
        worst = worst_relative(losses, ref)
        print(f"frozen parameters: worst relative difference {worst:.2e}")
        self.assertLess(worst, LOSS_RTOL)
        for n, before in frozen_before.items():
            self.assertTrue(torch.equal(weights[n], before), f"frozen {n} changed")


class Grouping(unittest.TestCase):
    def group_names(self, model, groups=None):
        with strata.torch.initialize(model, config(), groups) as engine:
            return [g.name for g in engine.groups]

    def test_automatic_rule(self):
        # The root's own parameter; the tied embedding and output layer merged; each
        # Sequential child whole; elsewhere each module owning parameters ("shared" owns
        # none itself: its LayerNorm and Linears are groups).
        self.assertEqual(self.group_names(user_model()),
                         ["(root)", "embed+out", "stack.0", "stack.1", "shared.norm", "shared.up", "shared.down",
                          "unused"])

    def test_explicit_groups(self):
        m = user_model()
        self.assertEqual(self.group_names(m, [m]), ["(root)"])  # the whole model
        # A module nested in another group's module is carved out of it: "stack" keeps
        # stack.1, the root only its own parameter. Names or modules; a tuple is one
        # group, in which a member inside another member binds nothing of its own.
        m = user_model()
        self.assertEqual(self.group_names(m, ["", ("embed", m.out), "stack", m.stack[0], ("shared", "shared.norm"),
                                              "unused"]),
                         ["(root)", "embed+out", "stack", "stack.0", "shared", "unused"])

    def assert_refused(self, make, groups, *words, status="STRATA_ERR_INVALID_ARGUMENT"):
        model = make()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with self.assertRaises(strata.StrataError) as e:
            strata.torch.initialize(model, config(), groups)
        self.assertEqual(e.exception.status, status)
        for w in words:
            self.assertIn(w, str(e.exception))
        # A refused model is left as it was.
        self.assertEqual(list(before), [n for n, _ in model.named_parameters()])
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p, before[n]))
        return str(e.exception)

    def test_ties_across_explicit_groups_are_refused(self):
        msg = self.assert_refused(user_model, ["", "embed", "out", "stack", "shared", "unused"],
                                  "'embed.weight' is in two groups, 'embed' and 'out'", "tied", "('embed', 'out')")
        print("tie across groups:", msg)

    def test_explicit_groups_must_cover_every_parameter_once(self):
        self.assert_refused(user_model, [("embed", "out"), "stack", "shared"],
                            "outside every group: gate, unused.weight, unused.bias")
        self.assert_refused(user_model, ["", ("embed", "out"), "stack", "shared", "stack", "unused"],
                            "'stack.0.norm.weight' is in two groups", "list a module once")
        self.assert_refused(user_model, ["", "embed+out"], "'embed+out' is not a submodule")
        self.assert_refused(user_model, [nn.Linear(2, 2)], "not a submodule")
        self.assert_refused(lambda: nn.Sequential(nn.Linear(2, 2), nn.ReLU()), ["0", "1"],
                            "group '1' holds no parameters")


class Misuse(unittest.TestCase):
    def setUp(self):
        self.engine = strata.torch.initialize(user_model(), config())
        self.tokens = batch(0, VOCAB)

    def tearDown(self):
        self.engine.close()

    def assert_state_error(self, call, *words):
        with self.assertRaises(strata.StrataError) as e:
            call()
        self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
        for w in words:
            self.assertIn(w, str(e.exception))

    def test_order_of_calls(self):
        e = self.engine
        self.assert_state_error(e.step, "engine.step() now (between micro-batches)", "run a forward with gradients enabled")
        loss = e(self.tokens)
        self.assert_state_error(e.step, "engine.step() now (forward done", "call loss.backward() for the last forward")
        self.assert_state_error(lambda: e(self.tokens), "one forward per backward")
        with tempfile.TemporaryDirectory() as d:
            self.assert_state_error(lambda: e.save_checkpoint(d), "in the middle of a step")
        e.backward(loss)
        self.assert_state_error(lambda: e.backward(loss), "engine.backward(loss) now (backward done",
                                "call engine.step() after each engine.backward(loss)")
        self.assert_state_error(lambda: e(self.tokens), "call optimizer.step() (or engine.step())")
        self.assertTrue(e.step())
        # Nothing above reached Strata: training goes on.
        train_engine(e, loss_of, batches(2, 1))

    def test_a_submodule_outside_the_models_forward(self):
        self.assert_state_error(lambda: self.engine.module.stack(torch.zeros(2, 3, 32)), "ran outside the model's forward",
                                "call the model")

    def test_loss_without_gradient(self):
        with torch.no_grad():
            loss = self.engine(self.tokens)
        self.assert_state_error(lambda: self.engine.backward(loss), "run a forward with gradients enabled")

    def test_client_state_must_be_json(self):
        train_engine(self.engine, loss_of, batches(1))
        with tempfile.TemporaryDirectory() as d, self.assertRaises(strata.StrataError) as e:
            self.engine.save_checkpoint(d, client_state={"set": {1, 2}})
        self.assertIn("JSON", str(e.exception))


class StandardLoopMisuse(unittest.TestCase):
    def setUp(self):
        self.engine = strata.torch.initialize(user_model(), config(accumulation=2))
        self.model, self.optimizer = self.engine
        self.tokens = batch(0, VOCAB)

    def tearDown(self):
        self.engine.close()

    assert_state_error = Misuse.assert_state_error

    def backward(self):
        self.model(self.tokens).backward()

    def test_step_needs_every_micro_batch_of_a_step(self):
        self.assert_state_error(self.optimizer.step, "optimizer.step() now (between micro-batches)")
        loss = self.model(self.tokens)
        self.assert_state_error(self.optimizer.step, "call loss.backward() for the last forward first")
        loss.backward()
        self.assert_state_error(self.optimizer.step, "after 1 micro-batch(es)", "gradient_accumulation_steps is 2")
        self.assert_state_error(self.optimizer.zero_grad, "cannot be dropped")
        self.backward()
        self.assert_state_error(self.backward, "without an optimizer step", "call optimizer.step()")
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.backward()  # training goes on

    def test_a_backward_outside_its_micro_batch(self):
        loss = self.model(self.tokens)
        loss.backward(retain_graph=True)
        with self.assertRaisesRegex(RuntimeError, "a second backward through one forward"):
            loss.backward(retain_graph=True)
        self.model(self.tokens).backward()  # accumulation 2: this micro-batch ends the step
        self.optimizer.step()
        with self.assertRaisesRegex(RuntimeError, "outside its micro-batch"):
            loss.backward()

    def test_clipping_and_a_second_optimizer_are_refused(self):
        self.backward()
        with self.assertRaises(strata.StrataError) as e:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.assertIn("gradient_clipping", str(e.exception))
        other = torch.optim.AdamW(self.model.parameters())
        with self.assertRaises(strata.StrataError) as e:
            other.step()
        self.assertIn("step with the optimizer strata.torch.initialize returned", str(e.exception))

    def test_freezing_after_initialize(self):
        self.model.stack[0].up.weight.requires_grad_(False)
        self.assert_state_error(self.backward, "'stack.0.up.weight' was trainable at strata.torch.initialize",
                                "set requires_grad before initialize")

    def test_hyper_parameters_other_than_the_lr(self):
        self.optimizer.param_groups[0]["betas"] = (0.5, 0.9)
        with self.assertRaises(strata.StrataError) as e:
            self.backward()
        self.assertIn("takes betas from the config", str(e.exception))

    def test_a_learning_rate_that_is_not_a_number(self):
        for bad in (float("nan"), -1.0, "0.1"):
            self.optimizer.param_groups[0]["lr"] = bad
            with self.assertRaises(strata.StrataError) as e:
                self.backward()
            self.assertIn("set a finite number >= 0", str(e.exception))
        self.optimizer.param_groups[0]["lr"] = 1e-3
        self.backward()  # a good lr again: training goes on

    def test_the_lr_changed_inside_a_step(self):
        self.backward()
        self.backward()
        self.optimizer.param_groups[0]["lr"] = 1.0
        self.assert_state_error(self.optimizer.step, "changed after this step's first forward")

    def test_initialize_twice(self):
        with self.assertRaises(strata.StrataError) as e:
            strata.torch.initialize(self.model, config())
        self.assertIn("held by a Strata engine already", str(e.exception))

    def test_a_scheduler_section_and_a_torch_scheduler(self):
        c = config(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}})
        with strata.torch.initialize(user_model(), c) as engine:
            model, optimizer = engine
            optimizer.param_groups[0]["lr"] = 0.5
            with self.assertRaises(strata.StrataError) as e:
                model(self.tokens)
            self.assertIn("scheduler section", str(e.exception))


class Refused(unittest.TestCase):
    assert_refused = Grouping.assert_refused

    def test_float64_and_integer_parameters(self):
        def double():
            m = user_model()
            m.stack[1].up.double()
            return m

        def integer():
            m = user_model()
            m.counts = nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)
            return m

        self.assert_refused(double, None, "'stack.1.up.weight' is torch.float64", "model.float()",
                            status="STRATA_ERR_DTYPE")
        self.assert_refused(integer, None, "'counts' is torch.int64", "register_buffer", status="STRATA_ERR_DTYPE")

    def test_everything_frozen(self):
        def frozen():
            m = user_model()
            m.requires_grad_(False)
            return m

        self.assert_refused(frozen, None, "every parameter of the model is frozen", "nothing to train")

    def test_sparse_embedding_and_no_parameters(self):
        self.assert_refused(lambda: nn.Sequential(nn.Embedding(4, 2, sparse=True)), None, "sparse=True")
        model = user_model()
        strata.torch.initialize(model, config()).close()
        with self.assertRaises(strata.StrataError) as e:
            strata.torch.initialize(model, config())
        self.assertEqual(e.exception.status, "STRATA_ERR_STATE")
        self.assertIn("held by a Strata engine already", str(e.exception))


class Checkpoints(unittest.TestCase):
    def test_a_fresh_engine_continues_identically(self):
        with tempfile.TemporaryDirectory() as tmp:
            nvme_a, nvme_b, ckpt = (os.path.join(tmp, n) for n in ("nvme-a", "nvme-b", "ckpt"))
            for d in (nvme_a, nvme_b):
                os.mkdir(d)
            with strata.torch.initialize(user_model(), config(nvme_a)) as engine:
                train_engine(engine, loss_of, batches(5))
                saved = engine.save_checkpoint(ckpt, client_state={"epoch": 3, "position": 5})
                continued = train_engine(engine, loss_of, batches(5, 5))
            # Another initial model (seed 1): everything comes from the checkpoint.
            with strata.torch.initialize(user_model(seed=1), config(nvme_b)) as engine:
                path, client = engine.load_checkpoint(ckpt)
                self.assertEqual((path, client), (saved, {"epoch": 3, "position": 5}))
                self.assertEqual(engine.global_steps, 5)
                resumed = train_engine(engine, loss_of, batches(5, 5))
            self.assertEqual(sorted(os.listdir(tmp)), ["ckpt", "nvme-a", "nvme-b"])
        print("continued", [f"{x:.6f}" for x in continued])
        self.assertEqual(resumed, continued, "the resumed run differs")
        # Not a test that cannot fail: without the checkpoint the losses differ.
        with strata.torch.initialize(user_model(seed=1), config()) as engine:
            self.assertNotEqual(train_engine(engine, loss_of, batches(5, 5)), continued)


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny models; OpenMP's spinning threads only slow a busy machine
    unittest.main()
