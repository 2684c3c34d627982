"""tally-worker --data_root: a job whose dataset resolves outside the worker's
data roots (by "..", by an absolute path, through a symlink) fails after one
attempt, naming the path and the roots; a job inside them trains."""

import os
import shutil
import tempfile
import unittest

from harness import TRAIN_PATH, ClusterTest, jobs_pb2, spec

DATASET_FILES = [TRAIN_PATH + ext for ext in (".json", ".idx", ".bin")]
VAL_PREFIX = os.path.join(os.path.dirname(TRAIN_PATH), "val")


class DataRootsTest(ClusterTest):

    def setUp(self):
        super().setUp()
        # The corpus the harness prepared stays outside the root; a copy of
        # it goes inside.
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="tally_root_"))
        self.other_root = os.path.realpath(tempfile.mkdtemp(prefix="tally_root2_"))
        self.inside = os.path.join(self.root, "corpus")
        os.mkdir(self.inside)
        for prefix in (TRAIN_PATH, VAL_PREFIX):
            for ext in (".json", ".idx", ".bin"):
                shutil.copy(prefix + ext, self.inside)
        self.roots_text = "%s, %s" % (self.root, self.other_root)
        self.add_worker("w1", extra_args=["--data_root=%s,%s/" % (self.root, self.other_root)])

    def tearDown(self):
        super().tearDown()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.other_root, ignore_errors=True)

    def submit_path(self, train_path, name):
        s = spec(max_steps=5, name=name)
        s.data.train_path = train_path
        return self.submit(s).name

    def assert_refused(self, name, given, resolved):
        job = self.wait_state(name, jobs_pb2.JOB_STATE_FAILED, timeout=60)
        self.assertEqual(job.attempt, 1, "refused without a retry")
        self.assertIn('spec.data.train_path "%s"' % given, job.state_reason)
        self.assertIn("resolves to %s" % resolved, job.state_reason)
        self.assertIn("outside the worker's data roots (%s)" % self.roots_text, job.state_reason)
        self.assertIn("--data_root", job.state_reason)
        events = self.events(name)
        self.assertEqual([e.attempt for e in events if e.type == "started"], [1])

    def test_paths_outside_the_roots_fail_at_once_and_a_path_inside_trains(self):
        outside = os.path.realpath(TRAIN_PATH)
        # ".." out of the root, relative to it.
        dotdot = os.path.join(self.inside, os.path.relpath(TRAIN_PATH, self.inside))
        self.assertIn("..", dotdot)
        # A symlink inside the root to the corpus outside it.
        link_dir = os.path.join(self.root, "linked")
        os.symlink(os.path.dirname(outside), link_dir)
        linked = os.path.join(link_dir, os.path.basename(TRAIN_PATH))
        names = {
            "dotdot": self.submit_path(dotdot, "dotdot"),
            "absolute": self.submit_path(TRAIN_PATH, "absolute"),
            "symlink": self.submit_path(linked, "symlink"),
            "inside": self.submit_path(os.path.join(self.inside, "train"), "inside"),
        }
        self.assert_refused(names["dotdot"], dotdot, outside)
        self.assert_refused(names["absolute"], TRAIN_PATH, outside)
        self.assert_refused(names["symlink"], linked, outside)
        done = self.wait_state(names["inside"], jobs_pb2.JOB_STATE_SUCCEEDED, timeout=120)
        self.assertEqual(done.step, 5)
        self.assertEqual(done.attempt, 1)
        with open(self.workers[0].log_path) as f:
            log = f.read()
        self.assertNotIn("no --data_root", log)


if __name__ == "__main__":
    unittest.main()
