"""tally-prep as a user runs it: prepare a corpus, then `tally-prep verify` on
the dataset as written and after each kind of damage, with its exit codes
(0 OK, 1 damaged or unverifiable, 2 usage). Needs only the tally-prep binary."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

from harness import TALLY_PREP

IDX_HEADER = 24


def run(*args):
    return subprocess.run([TALLY_PREP] + list(args), capture_output=True, text=True,
                          timeout=60)


class VerifyTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_prep_verify_")
        self.addCleanup(shutil.rmtree, self.dir)
        corpus = os.path.join(self.dir, "corpus.txt")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write("fortune number %d, %s\n%%\n" % (i, "words " * (i % 17)))
        self.out = os.path.join(self.dir, "data")
        prep = run("--out=" + self.out, "--val_fraction=0.2", corpus)
        self.assertEqual(prep.returncode, 0, prep.stderr)
        self.train = os.path.join(self.out, "train")

    def patch(self, path, offset, data):
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def assert_fails_naming(self, path_arg, needle):
        r = run("verify", path_arg)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(needle, r.stderr)
        self.assertNotIn("OK", r.stdout)

    def test_fresh_dataset_verifies_by_directory_prefix_and_file(self):
        for arg in (self.out, self.out + "/", self.train, self.train + ".bin"):
            r = run("verify", arg)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stdout)
            self.assertTrue(lines[0].startswith("tally-prep verify: OK "), lines[0])
        r = run("verify", self.out)
        self.assertIn("/train (", r.stdout)
        self.assertIn("/val (", r.stdout)
        self.assertIn("SHA-256 of 4 files match", r.stdout)

    def test_recorded_hash_is_the_files_sha256(self):
        with open(self.train + ".json") as f:
            meta = json.load(f)
        for ext in ("bin", "idx"):
            with open(self.train + "." + ext, "rb") as f:
                self.assertEqual(meta["content_sha256"][ext], hashlib.sha256(f.read()).hexdigest())

    def test_in_vocabulary_bin_flip_is_a_hash_mismatch(self):
        # Token 1 of document 0 is the first text byte ('f'); 'g' is as valid.
        self.patch(self.train + ".bin", 2, struct.pack("<H", ord("g")))
        self.assert_fails_naming(self.out, "train.bin: SHA-256")

    def test_out_of_vocabulary_token_is_named(self):
        self.patch(self.train + ".bin", 2, struct.pack("<H", 4000))
        self.assert_fails_naming(self.train, "train.bin: token id 4000")

    def test_index_boundary_shift_is_caught(self):
        with open(self.train + ".idx", "rb") as f:
            f.seek(IDX_HEADER + 8 * 2)
            offset = struct.unpack("<Q", f.read(8))[0]
        self.patch(self.train + ".idx", IDX_HEADER + 8 * 2, struct.pack("<Q", offset + 1))
        self.assert_fails_naming(self.out, "train.idx")

    def test_directory_missing_a_split_fails(self):
        os.remove(os.path.join(self.out, "val.idx"))
        self.assert_fails_naming(self.out, "val.idx: no such file")

    def test_a_damaged_digest_in_the_json_blames_the_json_not_the_intact_bin(self):
        with open(self.train + ".json") as f:
            meta = json.load(f)
        digest = meta["content_sha256"]["bin"]
        meta["content_sha256"]["bin"] = ("1" if digest[0] == "0" else "0") + digest[1:]
        with open(self.train + ".json", "w") as f:
            json.dump(meta, f)
        r = run("verify", self.out)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("train.json: its \"content_sha256\" record is damaged", r.stderr)
        self.assertIn("the data files are not to blame", r.stderr)
        self.assertNotIn("train.bin: SHA-256", r.stderr)

    def test_dataset_without_a_recorded_hash_says_so(self):
        with open(self.train + ".json") as f:
            meta = json.load(f)
        del meta["content_sha256"]
        with open(self.train + ".json", "w") as f:
            json.dump(meta, f)
        self.assert_fails_naming(self.train, "records no content hash")

    def test_usage_errors_exit_2(self):
        empty = os.path.join(self.dir, "empty")
        os.mkdir(empty)
        for args in (["verify"], ["verify", self.out, self.out],
                     ["verify", os.path.join(self.dir, "nothing")], ["verify", empty]):
            r = run(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("tally-prep: "), r.stderr)


class HostileInputTest(unittest.TestCase):
    def test_overlong_line_names_file_and_line(self):
        d = tempfile.mkdtemp(prefix="tally_prep_hostile_")
        self.addCleanup(shutil.rmtree, d)
        corpus = os.path.join(d, "big.txt")
        with open(corpus, "w") as f:
            f.write("short\n%\n" + "x" * 5000 + "\n")
        r = run("--out=" + os.path.join(d, "out"), "--max_line_bytes=1000", corpus)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("big.txt:3: line is longer than 1000 bytes", r.stderr)


if __name__ == "__main__":
    unittest.main()


def read_lengths(prefix):
    """Document lengths of a dataset, from its .idx (worker/data/dataset.h):
    a 24-byte header, then num_docs + 1 uint64 offsets."""
    with open(prefix + ".idx", "rb") as f:
        data = f.read()
    offsets = struct.unpack_from("<%dQ" % ((len(data) - IDX_HEADER) // 8), data, IDX_HEADER)
    return [b - a for a, b in zip(offsets, offsets[1:])]


class ValidationSplitTest(unittest.TestCase):
    """How concentrated the validation split is, and --val_tokens."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_prep_split_")
        self.addCleanup(shutil.rmtree, self.dir)
        # A long tail: 600 short documents, a few long, one very long.
        self.corpus = os.path.join(self.dir, "corpus.txt")
        with open(self.corpus, "w") as f:
            for i in range(600):
                n = 20 if i % 97 else 600
                if i == 300:
                    n = 8000
                f.write("entry %d: %s\n%%\n" % (i, "lorem ipsum " * (n // 12 + i % 5)))

    def test_val_tokens_holds_out_about_that_many_with_no_document_over_ten_percent(self):
        out = os.path.join(self.dir, "data")
        r = run("--out=" + out, "--val_tokens=20000", self.corpus)
        self.assertEqual(r.returncode, 0, r.stderr)
        lengths = read_lengths(out + "/val")
        self.assertGreater(sum(lengths), 15000)
        self.assertLess(sum(lengths), 25000)
        self.assertLessEqual(max(lengths), 0.10 * 20000)
        self.assertIn("validation split: its largest document holds", r.stdout)
        self.assertIn("stayed in training", r.stdout)
        self.assertNotIn("warning", r.stderr)
        with open(out + "/val.json") as f:
            meta = json.load(f)
        self.assertEqual(meta["extra"]["val_tokens"], 20000)
        # Every document is in one split or the other.
        self.assertEqual(len(lengths) + len(read_lengths(out + "/train")), 600)

    def test_a_concentrated_split_is_warned_about(self):
        out = os.path.join(self.dir, "few")
        # A tiny split by fraction: the long documents dominate it whenever
        # one is held out; with seed search, find one that is held out.
        for seed in range(40):
            r = run("--out=" + out, "--val_fraction=0.02", "--seed=%d" % seed, self.corpus)
            self.assertEqual(r.returncode, 0, r.stderr)
            lengths = read_lengths(out + "/val")
            if max(lengths) > 0.1 * sum(lengths):
                self.assertIn("warning: the validation split is concentrated", r.stderr)
                self.assertIn("--val_tokens", r.stderr)
                return
            self.assertNotIn("warning", r.stderr)
        self.fail("no seed held out a long document")

    def test_val_tokens_usage_errors(self):
        out = os.path.join(self.dir, "bad")
        r = run("--out=" + out, "--val_tokens=-1", self.corpus)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--val_tokens", r.stderr)
        r = run("--out=" + out, "--val_tokens=1000", "--val_fraction=0.1", self.corpus)
        self.assertEqual(r.returncode, 2)
        self.assertIn("give one", r.stderr)
