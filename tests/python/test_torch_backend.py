"""The "loom" torch.distributed backend against gloo, on 4 processes: a small
model trained 50 steps with DistributedDataParallel, and 50 ZeRO-style steps
(reduce-scatter of gradients, all-gather of parameters), from the same seed,
must end with the same parameters and loss curves up to floating-point
reordering; every collective the backend offers is checked against known
values. Skipped where torch is not installed."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch.distributed  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4


def run(backend, mode, world=WORLD, timeout=600):
    with tempfile.TemporaryDirectory(prefix="loom_torch_") as d:
        init = os.path.join(d, "init")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "torch_worker.py"), backend,
                                   str(r), str(world), init, os.path.join(d, "out%d.json" % r), mode],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for r, p in enumerate(procs):
            if p.returncode != 0:
                raise AssertionError("%s rank %d exited %s:\n%s" % (backend, r, p.returncode, logs[r]))
        out = []
        for r in range(world):
            with open(os.path.join(d, "out%d.json" % r)) as f:
                out.append(json.load(f))
        return out


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol * (1 + abs(y)) for x, y in zip(a, b))


@unittest.skipUnless(HAVE_TORCH, "torch not installed")
class TorchBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gloo = run("gloo", "train")
        cls.loom = run("loom", "train")

    def test_ddp_matches_gloo(self):
        for r in range(WORLD):
            g, l = self.gloo[r], self.loom[r]
            self.assertTrue(close(l["ddp_losses"], g["ddp_losses"], 1e-4),
                            "rank %d losses %s vs gloo %s" % (r, l["ddp_losses"][-3:], g["ddp_losses"][-3:]))
            self.assertTrue(close(l["ddp_params"], g["ddp_params"], 1e-4), "rank %d params" % r)
        # The training did something: the loss fell and every rank holds the same model.
        self.assertLess(self.loom[0]["ddp_losses"][-1], self.loom[0]["ddp_losses"][0])
        for r in range(1, WORLD):
            self.assertEqual(self.loom[r]["ddp_params"], self.loom[0]["ddp_params"])

    def test_zero_matches_gloo(self):
        for r in range(WORLD):
            g, l = self.gloo[r], self.loom[r]
            self.assertTrue(close(l["zero_losses"], g["zero_losses"], 1e-4), "rank %d losses" % r)
            self.assertTrue(close(l["zero_params"], g["zero_params"], 1e-4), "rank %d params" % r)
        self.assertLess(self.loom[0]["zero_losses"][-1], self.loom[0]["zero_losses"][0])

    def test_every_collective(self):
        for world in (2, 3):
            for r, res in enumerate(run("loom", "colls", world)):
                self.assertEqual(res["failures"], [], "world %d rank %d" % (world, r))


if __name__ == "__main__":
    unittest.main()
