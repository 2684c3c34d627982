"""Bring your own tokens: tally-prep with a SentencePiece model (one it trains,
train-tokenizer) and with pre-tokenized JSONL; the dataset records its
tokenizer, checkpoints carry it, and training, bits per byte, a start from a
checkpoint and the Hugging Face export all honour it."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import BUILD, FORTUNES, TALLY_PREP, TALLY_TRAIN

EXPORT = os.path.join(BUILD, "worker", "tally-export")
CORPUS = [os.path.join(FORTUNES, f + ".u8") for f in
          ("fortunes", "literature", "science", "people", "wisdom", "humorists", "computers")]


def run(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (args[0], p.returncode, p.stdout,
                                                        p.stderr))
    return p


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def train(d, train_path, model=None, steps=6, init_from=None, check=True):
    m = dict(model or {"num_layers": 1, "d_model": 32, "num_heads": 2})
    if init_from:
        m["init_from"] = init_from
    spec = {"model": m, "data": {"train_path": train_path, "seq_len": 128},
            "training": {"max_steps": steps, "micro_batch_rows": 4, "eval_interval_steps": steps,
                         "eval_tokens": 8192, "seed": 1},
            "optimizer": {"lr": 3e-3, "warmup_steps": 2}}
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return run([TALLY_TRAIN, "--spec=" + path, "--checkpoint_dir=" + d], check=check)


class TokenizersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tally_tok_")
        cls.model = os.path.join(cls.dir, "tok.model")
        cls.trained = run([TALLY_PREP, "train-tokenizer", "--vocab_size=1000",
                           "--out=" + cls.model] + CORPUS)
        cls.spm_data = os.path.join(cls.dir, "spm")
        cls.prep = run([TALLY_PREP, "--out=" + cls.spm_data,
                        "--tokenizer=sentencepiece:" + cls.model] + CORPUS)

    def test_train_tokenizer_writes_a_model_prep_can_use(self):
        self.assertIn("1000 pieces", self.trained.stdout)
        self.assertTrue(os.path.isfile(self.model))
        meta = read_json(os.path.join(self.spm_data, "train.json"))
        self.assertEqual(meta["version"], 2)
        self.assertEqual(meta["tokenizer"], "sentencepiece")
        self.assertEqual((meta["vocab_size"], meta["bos"], meta["eos"]), (1000, 1, 2))
        self.assertEqual(meta["tokenizer_model"]["sha256"], sha256(self.model))
        self.assertEqual(meta["token_bytes"], 2)
        # Subword tokens: several bytes of text each.
        self.assertGreater(meta["text_bytes"], 2 * meta["text_tokens"])
        run([TALLY_PREP, "verify", self.spm_data])

    def test_bits_per_byte_counts_bytes_of_text_not_tokens(self):
        d = os.path.join(self.dir, "bpb")
        p = train(d, os.path.join(self.spm_data, "train"), steps=30)
        evals = re.findall(r"val_loss ([0-9.]+), ([0-9.]+) bits/byte", p.stdout)
        self.assertTrue(evals, p.stdout)
        loss, bpb = map(float, evals[-1])
        meta = read_json(os.path.join(self.spm_data, "val.json"))
        per_token_bits = loss / 0.6931471805599453
        # A subword token carries several bytes: bits per byte is the bits per
        # token over the bytes per token (BOS/EOS aside), not the same number.
        expected = per_token_bits * meta["text_tokens"] / meta["text_bytes"]
        self.assertLess(bpb, per_token_bits / 2)
        self.assertAlmostEqual(bpb, expected, delta=0.25 * expected)

    def test_a_model_of_another_vocabulary_is_refused_naming_both(self):
        p = train(os.path.join(self.dir, "wrong_vocab"), os.path.join(self.spm_data, "train"),
                  model={"num_layers": 1, "d_model": 32, "num_heads": 2, "vocab_size": 258},
                  check=False)
        self.assertNotEqual(p.returncode, 0)
        out = p.stdout + p.stderr
        self.assertIn("vocabulary has 1000 tokens", out)
        self.assertIn("vocab_size of 258", out)

    def test_starting_from_a_model_of_another_tokenizer_is_refused(self):
        # The same vocabulary size from another tokenizer: only the tokenizer
        # record tells them apart.
        other = os.path.join(self.dir, "uni.model")
        run([TALLY_PREP, "train-tokenizer", "--vocab_size=1000", "--model_type=unigram",
             "--out=" + other] + CORPUS)
        other_data = os.path.join(self.dir, "spm_uni")
        run([TALLY_PREP, "--out=" + other_data, "--tokenizer=sentencepiece:" + other] + CORPUS)
        base = os.path.join(self.dir, "base_bpe")
        train(base, os.path.join(self.spm_data, "train"), steps=2)
        p = train(os.path.join(self.dir, "ft_uni"), os.path.join(other_data, "train"),
                  init_from={"checkpoint": os.path.join(base, "step-00000002.ckpt")},
                  check=False)
        self.assertNotEqual(p.returncode, 0)
        out = p.stdout + p.stderr
        self.assertIn("trained with tokenizer", out)
        self.assertIn("model_sha256 differs", out)
        # The same tokenizer starts fine.
        train(os.path.join(self.dir, "ft_bpe"), os.path.join(self.spm_data, "train"),
              init_from={"checkpoint": os.path.join(base, "step-00000002.ckpt")})

    def test_export_carries_the_sentencepiece_model(self):
        d = os.path.join(self.dir, "export_src")
        train(d, os.path.join(self.spm_data, "train"), steps=2)
        ckpt = os.path.join(d, "step-00000002.ckpt")
        out = os.path.join(self.dir, "hf_spm")
        # A folder that held a byte-tokenizer export: its tokenizer.json would
        # win over tokenizer.model in a loader, so it must go.
        os.makedirs(out)
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write("{}")
        run([EXPORT, "--checkpoint=" + ckpt, "--out=" + out])
        self.assertFalse(os.path.exists(os.path.join(out, "tokenizer.json")))
        self.assertEqual(sha256(os.path.join(out, "tokenizer.model")), sha256(self.model))
        tc = read_json(os.path.join(out, "tokenizer_config.json"))
        self.assertEqual(tc["tokenizer_class"], "LlamaTokenizer")
        config = read_json(os.path.join(out, "config.json"))
        self.assertEqual((config["vocab_size"], config["bos_token_id"], config["eos_token_id"]),
                         (1000, 1, 2))
        # Moved away: refused, then found again by --tokenizer_model (checked).
        moved = os.path.join(self.dir, "moved.model")
        shutil.copy(self.model, moved)
        hidden = self.model + ".away"
        os.rename(self.model, hidden)
        try:
            p = run([EXPORT, "--checkpoint=" + ckpt, "--out=" + out + "2"], check=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn("--tokenizer_model", p.stderr)
            run([EXPORT, "--checkpoint=" + ckpt, "--out=" + out + "2",
                 "--tokenizer_model=" + moved])
            p = run([EXPORT, "--checkpoint=" + ckpt, "--out=" + out + "3",
                     "--tokenizer_model=" + CORPUS[0]], check=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn("is not the SentencePiece model", p.stderr)
        finally:
            os.rename(hidden, self.model)

    def test_bad_tokenizer_flags_exit_2(self):
        out = os.path.join(self.dir, "bad")
        for args, message in [
            (["--tokenizer=wordpiece"], "--tokenizer: must be byte or sentencepiece:PATH"),
            (["--tokenizer=sentencepiece:" + CORPUS[0]], "not a SentencePiece model"),
            (["--tokenizer=sentencepiece:/nonexistent.model"], "no such file"),
            (["--bos=1"], "only for pre-tokenized input"),
            (["--vocab_size=100"], "read from JSONL"),
        ]:
            with self.subTest(args=args):
                p = run([TALLY_PREP, "--out=" + out] + args + CORPUS[:1], check=False)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(message, p.stderr)
        p = run([TALLY_PREP, "train-tokenizer", "--vocab_size=5", "--out=" + self.model + "x"]
                + CORPUS[:1], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--vocab_size", p.stderr)


class PretokenizedTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tally_pretok_")

    def write_jsonl(self, rows):
        path = os.path.join(self.dir, "ids.jsonl")
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return path

    def test_ids_beyond_two_bytes_train_in_four_byte_tokens(self):
        # Byte-valued ids spread over a vocabulary of 70,000: 4-byte tokens.
        with open(CORPUS[0], encoding="utf-8") as f:
            text = f.read().split("\n%\n")[:400]
        rows = [{"input_ids": [b * 271 % 69990 for b in t.encode()], "n": i}
                for i, t in enumerate(text) if t.strip()]
        src = self.write_jsonl(rows)
        data = os.path.join(self.dir, "data")
        p = run([TALLY_PREP, "--out=" + data, "--format=jsonl", "--field=input_ids",
                 "--vocab_size=70000", "--bos=69998", "--eos=69999", src])
        self.assertIn("pre-tokenized", p.stdout)
        meta = read_json(os.path.join(data, "train.json"))
        self.assertEqual((meta["tokenizer"], meta["vocab_size"], meta["token_bytes"]),
                         ("pretokenized", 70000, 4))
        self.assertEqual((meta["bos"], meta["eos"]), (69998, 69999))
        size = os.path.getsize(os.path.join(data, "train.bin"))
        self.assertEqual(size, 4 * meta["num_tokens"])
        run([TALLY_PREP, "verify", data])
        p = train(os.path.join(self.dir, "run"), os.path.join(data, "train"), steps=4)
        self.assertIn("trained 4 steps", p.stdout)

    def test_bad_ids_are_refused_naming_the_line(self):
        data = os.path.join(self.dir, "data")
        for rows, message in [
            ([{"input_ids": [1, 2]}, {"input_ids": [1, 2]}, {"input_ids": [3, 100]}],
             "ids.jsonl:3: \"input_ids\"[1] is 100, outside the vocabulary [0, 100)"),
            ([{"input_ids": [1, -2]}], "ids.jsonl:1: \"input_ids\"[1] is -2"),
            ([{"input_ids": [1, 2.5]}], "not an integer token id"),
            ([{"input_ids": "1 2 3"}], "holding an array of token ids"),
            ([{"text": "x"}], "no field \"input_ids\""),
        ]:
            with self.subTest(rows=rows):
                p = run([TALLY_PREP, "--out=" + data, "--format=jsonl", "--field=input_ids",
                         "--vocab_size=100", self.write_jsonl(rows)], check=False)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(message, p.stderr)
        p = run([TALLY_PREP, "--out=" + data, "--format=jsonl", "--field=input_ids",
                 self.write_jsonl([{"input_ids": [1, 2]}])], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--vocab_size", p.stderr)
        p = run([TALLY_PREP, "--out=" + data, "--format=jsonl", "--field=input_ids",
                 "--vocab_size=100", "--bos=100", self.write_jsonl([{"input_ids": [1]}])],
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--bos: must be a token id below --vocab_size (100)", p.stderr)


if __name__ == "__main__":
    unittest.main()
