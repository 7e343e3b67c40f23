"""The "loom" torch.distributed backend (python/loom/torch.py, torch 2.x) against gloo, in
real processes (one per rank, file:// rendezvous in a temporary folder, every wait bounded).

- Collectives (3 and 4 ranks): every collective, dtype and reduction, sync and async, the
  functional collectives, subgroups, object collectives, channels_last tensors,
  checked against values computed from the ranks' known inputs (torch_colls.py).
  gloo runs the same checks: it must fail exactly where it does not offer a feature
  (PREMUL_SUM, a (world, n) all-gather output), which shows the checks themselves are right.
- Training (2 and 4 ranks, 20 steps each): DDP (several buckets, no_sync,
  find_unused_parameters, allreduce_hook, bf16_compress_hook), a bf16 model with fp32
  master weights, ZeroRedundancyOptimizer, FSDP2 (fp32 and bf16 mixed precision) and
  tensor-parallel inference, eager and (loom, 2 ranks) under torch.compile (torch_train.py,
  torch_shard.py). Each backend's DDP and FSDP2 runs must match one process trained on all
  ranks' batches (the independent reference; 1e-5), its TP outputs the unsharded block's
  (1e-5), and loom must match gloo: bitwise on 2 ranks (one addition per element: the same
  in any order and in any accumulation precision), within TOL on 4 (ring against whatever
  loom picks: the order of the sums differs).
- Mismatch (2 ranks): ranks that call different collectives, sizes or dtypes at once raise
  torch's "Detected mismatch" on every rank under TORCH_DISTRIBUTED_DEBUG=DETAIL, on loom
  as on gloo, and Loom's own error under LOOM_CHECK_CALLS=1; the group works after.
- Straggler (loom, 3 ranks): loom-trace over LOOM_TRACE_DIR names the rank that sleeps in
  its data loader, and lists the operations it was last in by torch's sequence numbers.
- Kill (3 ranks): a rank SIGKILLs itself mid-training; every other rank's wait() raises
  within the group's 10 s timeout, nothing hangs (gloo: the harness itself). loom, over
  shared memory and over TCP: the error names the dead rank, the survivors exit 0, their
  dumps make loom-trace report the failure and the dead rank's missing dump, and no
  /dev/shm segment of the run's communicators is left.

The loom halves skip while python/loom/torch.py is missing; gloo needs only torch."""

import os
import re
import subprocess
import tempfile
import time
import unittest

import torch_launch as L

NO_TORCH = L.torch_missing()
needs_torch = unittest.skipIf(NO_TORCH, NO_TORCH)
needs_loom = unittest.skipIf(NO_TORCH or not L.have_loom_backend(),
                             NO_TORCH or "python/loom/torch.py (the loom backend) not found")

# Errors each backend may raise in torch_colls.check(), by check-name prefix. split_group is
# refused by torch itself on CPU-only builds (it needs an accelerator or torchcomms), so
# both backends must get torch's refusal, not a crash.
SPLIT_REFUSAL = "No device associated with the default pg"
ALLOWED_ERRORS = {
    "gloo": {"all_reduce premul_sum": "PREMUL_SUM", "reduce_scatter_tensor premul_sum": "PREMUL_SUM",
             "all_gather_into_tensor stacked": "invalid tensor size", "split_group": SPLIT_REFUSAL,
             "strided all_to_all_single": "Tensors must be contiguous"},
    "loom": {"split_group": SPLIT_REFUSAL},
}
# 4 ranks, loom against gloo: absolute tolerance on parameters (and relative on losses).
# Measured with gloo against the same training whose all-reduce sums in reverse order
# with fp32 accumulation: 6e-8 for the fp32 variants, 1.6e-3 for the bf16 ones; loom
# against gloo: 1.2e-7 and 2e-3.
TOL = {"ddp": 1e-5, "ddp_unused": 1e-5, "hook_allreduce": 1e-5, "zero": 1e-5, "fsdp": 1e-5,
       "pipeline": 1e-5,
       "hook_bf16": 1e-2, "bf16_master": 1e-2, "fsdp_bf16": 1e-2, "tp": 1e-5, "tp_compiled": 1e-5}
VARIANTS = sorted(TOL)


def variants_of(backend, world):
    """What a launch returns: the compiled block only on loom's 2 ranks (compiling costs each
    rank 25-40 s on 2 cores; gloo's eager results are what loom's are compared with)."""
    return [v for v in VARIANTS if v != "tp_compiled" or (backend, world) == ("loom", 2)]

_cache = {}


def results(backend, mode, world, **kw):
    """The ranks' results of one launch, run once per (backend, mode, world)."""
    key = (backend, mode, world)
    if key not in _cache:
        _cache[key] = L.launch(backend, mode, world, **kw)
    return _cache[key]


def maxdiff(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0) if len(a) == len(b) else float("inf")


class Collectives(unittest.TestCase):
    def check(self, backend):
        allowed = ALLOWED_ERRORS[backend]
        problems = []
        for world in (3, 4):
            for r, res in enumerate(results(backend, "colls", world)):
                where = "%s world %d rank %d" % (backend, world, r)
                problems += ["%s: wrong value: %s" % (where, f) for f in res["failures"]]
                if res["checks"] < 250:
                    problems.append("%s: only %d values checked" % (where, res["checks"]))
                for name, text in sorted(res["errors"].items()):
                    prefix = next((p for p in allowed if name.startswith(p)), None)
                    if not (prefix and allowed[prefix] in text):
                        problems.append("%s: %s raised %s" % (where, name, text))
                for prefix in allowed:  # each allowed error is one the backend really has
                    if not any(n.startswith(prefix) for n in res["errors"]):
                        problems.append("%s: %s no longer raises; update ALLOWED_ERRORS"
                                        % (where, prefix))
        if problems:
            self.fail("%d problems:\n%s" % (len(problems), "\n".join(problems[:40])))

    @needs_torch
    def test_gloo(self):
        self.check("gloo")

    @needs_loom
    def test_loom(self):
        self.check("loom")


class Mismatch(unittest.TestCase):
    """Ranks that make different calls at once (kinds, sizes, dtypes): with
    TORCH_DISTRIBUTED_DEBUG=DETAIL torch checks every call's fingerprint before the backend
    sees it, on loom as on gloo; every rank raises, and the group still works after."""

    def mismatch(self, backend, env=None, says="Detected mismatch between collectives"):
        out = L.launch(backend, "mismatch", 2, env=env or {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
        for r, res in enumerate(out):
            for what, text in sorted(res["raised"].items()):
                self.assertIsNotNone(text, "%s rank %d: %s did not raise" % (backend, r, what))
                self.assertIn(says, text, "%s rank %d: %s" % (backend, r, what))
            self.assertEqual(len(res["raised"]), 3, res)
            self.assertTrue(res["after"], "%s rank %d: the matching all_reduce" % (backend, r))

    @needs_torch
    def test_gloo(self):
        self.mismatch("gloo")

    @needs_loom
    def test_loom(self):
        self.mismatch("loom")

    @needs_loom
    def test_loom_check_calls(self):  # Loom's own check, without torch's
        self.mismatch("loom", {"LOOM_CHECK_CALLS": "1"}, "the ranks' calls differ")


class Training(unittest.TestCase):
    def train(self, backend, world):
        return results(backend, "train", world, timeout=240)

    def check_sane(self, backend, world):
        """One backend's run against the independent references, and with itself."""
        out = self.train(backend, world)
        ref = out[0]["reference"]
        where = "%s world %d" % (backend, world)
        for v in variants_of(backend, world):
            key = "output" if v.startswith("tp") else "params"
            for r in range(1, world):
                self.assertEqual(out[r]["variants"][v][key], out[0]["variants"][v][key],
                                 "%s %s: rank %d ends unlike rank 0" % (where, v, r))
            if not v.startswith("tp"):
                losses = out[0]["variants"][v]["losses"]
                self.assertEqual(len(losses), 20, v)
                self.assertLess(losses[-1], 0.5 * losses[0],
                                "%s %s did not learn: %s" % (where, v, losses))
        v = out[0]["variants"]
        for name, want in (("ddp", ref["ddp"]), ("fsdp", ref["fsdp"]),
                           ("pipeline", ref["pipeline"])):
            self.assertLess(maxdiff(v[name]["params"], want), 1e-5,
                            "%s %s against one process" % (where, name))
        self.assertLess(maxdiff(v["fsdp_bf16"]["params"], ref["fsdp"]), 0.05, where + " fsdp_bf16")
        for tp in (name for name in variants_of(backend, world) if name.startswith("tp")):
            self.assertLess(maxdiff(v[tp]["output"], ref["tp"]), 1e-5,
                            "%s %s against the unsharded block" % (where, tp))
            self.assertEqual(v[tp]["local_up_rows"], 64 // world, "%s %s shards" % (where, tp))
        self.assertGreaterEqual(v["ddp"]["buckets"], 3, where + " ddp buckets")
        self.assertLess(v["zero"]["owned"], len(v["zero"]["params"]), where + " zero shards")
        self.assertTrue(v["fsdp"]["sharded"], where)
        self.assertEqual(v["fsdp_bf16"]["param_dtypes"], ["torch.float32"], where + " fp32 master")

    def compare(self, world, bitwise):
        gloo, loom = self.train("gloo", world), self.train("loom", world)
        for v in variants_of("gloo", world):
            key = "output" if v.startswith("tp") else "params"
            for r in range(world):
                g, l = gloo[r]["variants"][v], loom[r]["variants"][v]
                where = "world %d rank %d %s" % (world, r, v)
                if bitwise:
                    self.assertEqual(l[key], g[key], "%s: %s differ from gloo's, max %g" % (
                        where, key, maxdiff(l[key], g[key])))
                    self.assertEqual(l.get("losses"), g.get("losses"),
                                     where + ": losses differ from gloo's")
                else:
                    self.assertLess(maxdiff(l[key], g[key]), TOL[v], where)
                    for a, b in zip(l.get("losses", []), g.get("losses", [])):
                        self.assertLess(abs(a - b), 2 * TOL[v] * (1 + abs(b)), where + " losses")

    @needs_torch
    def test_gloo_2_ranks(self):
        self.check_sane("gloo", 2)

    @needs_torch
    def test_gloo_4_ranks(self):
        self.check_sane("gloo", 4)

    @needs_loom
    def test_loom_2_ranks_bitwise(self):
        self.check_sane("loom", 2)
        self.compare(2, bitwise=True)

    @needs_loom
    def test_loom_4_ranks(self):
        self.check_sane("loom", 4)
        self.compare(4, bitwise=False)


class Straggler(unittest.TestCase):
    SLOW, SLEEP_MS, STEPS = 1, 100, 12  # 2.4 s of waiting on the slow rank: load elsewhere
    # on 2 cores (the suite beside it) made another rank the slowest once with 50 ms sleeps

    @needs_loom
    def test_loom_trace_names_the_slow_rank(self):
        tool = L.loom_trace_tool()
        if tool is None:
            self.skipTest("no loom-trace in the build")
        with tempfile.TemporaryDirectory(prefix="loom_torch_trace_") as trace:
            out = L.launch("loom", "straggler", 3, timeout=90, env={"LOOM_TRACE_DIR": trace},
                           args=(self.SLOW, self.SLEEP_MS, self.STEPS))
            self.assertTrue(all(len(o["losses"]) == self.STEPS for o in out))
            dumps = [f for f in os.listdir(trace) if f.endswith(".json")]
            self.assertGreaterEqual(len(dumps), 3, "trace dumps: %s" % dumps)
            p = subprocess.run([tool, trace], capture_output=True, text=True, timeout=60)
        report = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, report)
        # "slowest: rank 1, last in 15 of 40 operations, caused 450000.0 us of waiting", one
        # line per communicator; the one that caused most waiting must be the slow rank.
        found = [(float(w), int(r)) for r, w in re.findall(
            r"slowest: rank (\d+), last in \d+ of \d+ operations, caused ([\d.]+) us", report)]
        self.assertTrue(found, report)
        waited, rank = max(found)
        self.assertEqual(rank, self.SLOW, report)
        # The sleeps add up to STEPS x SLEEP_MS, each waited for by two ranks.
        self.assertGreater(waited, 0.5 * self.STEPS * self.SLEEP_MS * 1000, report)
        # Its operations are listed with torch's numbers for them: the backend tags each Loom
        # operation with the group's sequence number (1, 2, ... per collective).
        tagged = [int(t) for t in re.findall(
            r"rank %d was last in: seq \d+ \(tag (\d+)\)" % self.SLOW, report)]
        self.assertTrue(tagged, report)
        self.assertTrue(all(1 <= t <= 10 * self.STEPS for t in tagged), report)


class Kill(unittest.TestCase):
    WORLD, VICTIM, STEP, PG_TIMEOUT = 3, 1, 10, 10

    def kill(self, backend, env=None):
        before = L.loom_shm_names()
        # gloo's survivors sometimes abort after writing their result ("terminate called
        # without an active exception"); loom's must exit 0.
        exits = {r: None for r in range(self.WORLD)} if backend == "gloo" else {}
        exits[self.VICTIM] = -9
        with tempfile.TemporaryDirectory(prefix="loom_torch_kill_") as trace:
            env = dict(env or {}, TORCH_TEST_PG_TIMEOUT=str(self.PG_TIMEOUT), LOOM_TRACE_DIR=trace)
            out = L.launch(backend, "kill", self.WORLD, timeout=self.PG_TIMEOUT + 40, env=env,
                           args=(self.VICTIM, self.STEP), expect_exit=exits)
            self.assertIsNone(out[self.VICTIM])
            for r, res in enumerate(out):
                if r == self.VICTIM:
                    continue
                where = "%s rank %d (%s)" % (backend, r, res)
                self.assertIsNotNone(res, "rank %d wrote no result" % r)
                self.assertEqual(res["steps"], self.STEP, where)
                self.assertEqual(res.get("phase"), "wait", where)
                self.assertIsNotNone(res["after_kill_s"], where)
                self.assertLess(res["after_kill_s"], self.PG_TIMEOUT + 5, where)
            # loom's survivors dump their recorders (loom-trace-<comm hash>-rank<r>.json);
            # loom-trace must see the failure and the dead rank's missing dump.
            hashes = {f.split("-")[2] for f in os.listdir(trace) if f.startswith("loom-trace-")}
            tool = L.loom_trace_tool()
            if backend == "loom" and tool:
                p = subprocess.run([tool, trace], capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 5, p.stdout + p.stderr)  # stuck or failed
                self.assertIn("rank %d: no dump" % self.VICTIM, p.stdout)
        # No segment of this run's communicators (/loom-<hash>-<rank>) stays behind; without
        # dumps to name them, no new loom name at all (which a concurrent run may upset).
        left = set()
        for _ in range(40 if backend == "loom" else 0):  # a moment for the last unlinks
            left = {n for n in L.loom_shm_names() - before if not hashes or any(h in n for h in hashes)}
            if not left:
                break
            time.sleep(0.05)
        self.assertEqual(left, set(), "left in /dev/shm by the %s run" % backend)
        return out

    def names_victim(self, out):
        for r, res in enumerate(out):
            if r != self.VICTIM:
                self.assertRegex(res["error"], r"\brank %d\b" % self.VICTIM,
                                 "rank %d's error does not name the dead rank" % r)

    @needs_torch
    def test_gloo(self):  # the harness itself; gloo's errors name an address, not a rank
        self.kill("gloo")

    @needs_loom
    def test_loom(self):  # shared memory: the direct all-reduce
        self.names_victim(self.kill("loom"))

    @needs_loom
    def test_loom_tcp(self):  # LOOM_SHM_DISABLE=1: ranks talk over TCP
        self.names_victim(self.kill("loom", {"LOOM_SHM_DISABLE": "1"}))


if __name__ == "__main__":
    unittest.main()
